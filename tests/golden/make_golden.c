/* tests/golden/make_golden.c - writes the golden payloads and their MANIFEST.
 *
 *   make_golden OUTDIR
 *
 * Run once per format version: it writes the files of this build's format
 * (named v<major>_<name> from format 2 on) and appends their MANIFEST lines,
 * leaving every file and line of older versions as they are (they must keep
 * decoding). It refuses to run when this version's files are listed already.
 * Encodes with the scalar codec path,
 * the reference every other path must match. tests/test_golden.c checks each
 * file still verifies, decodes to the recorded hashes, and is what today's
 * encoder writes for the same input. */
#include <errno.h>

#include "golden/golden_common.h"
#include "kvt_internal.h"

#ifdef KVT_HAVE_ZSTD
#include <zstd.h>
#endif

/* Tiny shapes keep the files small (all under 200 KB); 16 tokens leave a
 * partial scale block (block=6) and a partial KIVI token group (32). */
#define L 2
#define T 16
#define H 2
#define D 64

typedef struct golden_def {
  const char *name, *spec;
  int dtype, zstd_level;
  uint32_t layer_begin, model_layers, token_begin;
  uint32_t tokens, heads, head_dim; /* 0: T, H, D */
} golden_def;

static const golden_def defs[] = {
    {"raw", "raw", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"k16v8", "k16v8", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"fp8", "fp8", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"int8", "int8", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"k16v4", "k16v4", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"k8v4", "k8v4", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"int4", "int4", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"int4_kgroup_dim", "int4,kgroup=dim,group=16", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"fp8_scale_block", "fp8,scale=block,block=6", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"int8_scale_layer", "int8,scale=layer", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    {"k8v4_raw1", "k8v4,raw=1", KVT_DTYPE_BF16, 0, 0, L, 0, 0, 0, 0},
    /* Layers 4..5 of an 8-layer model, the second kept raw by an absolute index. */
    {"fp8_layers4_5_raw5", "fp8,raw=5", KVT_DTYPE_BF16, 0, 4, 8, 40, 0, 0, 0},
    {"raw_zstd", "raw", KVT_DTYPE_BF16, 3, 0, L, 0, 0, 0, 0},
    {"k16v8_zstd", "k16v8", KVT_DTYPE_BF16, 3, 0, L, 0, 0, 0, 0},
    {"raw_fp16", "raw", KVT_DTYPE_F16, 0, 0, L, 0, 0, 0, 0},
    {"k16v8_fp16", "k16v8", KVT_DTYPE_F16, 0, 0, L, 0, 0, 0, 0},
    {"int8_fp16", "int8", KVT_DTYPE_F16, 0, 0, L, 0, 0, 0, 0},
    {"int4_fp16", "int4", KVT_DTYPE_F16, 0, 0, L, 0, 0, 0, 0},
    /* Format 2: sections of several 4 KiB checksum pieces, the last one
     * partial (raw K/V 35840 bytes; fp8 and int4 scales make odd sizes). */
    {"raw_pieces", "raw", KVT_DTYPE_BF16, 0, 0, L, 0, 70, 4, 64},
    {"fp8_pieces", "fp8", KVT_DTYPE_BF16, 0, 0, L, 0, 70, 4, 64},
    {"int4_pieces", "int4", KVT_DTYPE_BF16, 0, 0, L, 0, 64, 4, 128},
};

static int write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return -errno;
  int bad = fwrite(data, 1, n, f) != n;
  bad |= fclose(f) != 0;
  return bad ? -EIO : 0;
}

static int make_one(kvt_ctx *ctx, const char *dir, const golden_def *d, FILE *manifest) {
  golden_case c;
  memset(&c, 0, sizeof(c));
  if (KVT_FORMAT_VERSION >= 2)
    snprintf(c.name, sizeof(c.name), "v%d_%s", KVT_FORMAT_VERSION, d->name);
  else
    snprintf(c.name, sizeof(c.name), "%s", d->name);
  snprintf(c.spec, sizeof(c.spec), "%s", d->spec);
  c.dtype = d->dtype;
  c.zstd_level = d->zstd_level;
  c.seed = 20240601;
  c.layers = L, c.tokens = d->tokens ? d->tokens : T, c.heads = d->heads ? d->heads : H;
  c.head_dim = d->head_dim ? d->head_dim : D;
  c.layer_begin = d->layer_begin, c.model_layers = d->model_layers;
  c.token_begin = d->token_begin;
#ifdef KVT_HAVE_ZSTD
  c.zstd_version = d->zstd_level ? ZSTD_versionNumber() : 0;
#endif
  size_t n = golden_elems(&c);
  uint16_t *in = malloc(4 * n), *out = malloc(4 * n);
  uint8_t *payload = NULL;
  size_t len = 0;
  int rc = -ENOMEM;
  if (!in || !out)
    goto done;
  golden_input(&c, in, in + n);
  c.input_hash = kvt_hash64(in, 4 * n);
  if ((rc = golden_encode(ctx, &c, in, in + n, &payload, &len)) != 0)
    goto done;
  c.payload_hash = kvt_hash64(payload, len);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, out, out + n, c.dtype, c.layers, c.tokens, c.heads, c.head_dim);
  if ((rc = kvt_decode(ctx, payload, len, NULL, &view)) != 0)
    goto done;
  c.k_hash = kvt_hash64(out, 2 * n);
  c.v_hash = kvt_hash64(out + n, 2 * n);
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s.kvt", dir, c.name);
  if ((rc = write_file(path, payload, len)) == 0)
    rc = golden_write_line(manifest, &c);
  printf("%-22s %6zu bytes\n", c.name, len);
done:
  if (rc)
    fprintf(stderr, "%s: %s %s\n", d->name, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  free(payload);
  free(in);
  free(out);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.simd = KVT_SIMD_SCALAR;
  kvt_ctx *ctx;
  if (kvt_ctx_create(&cfg, &ctx) != 0)
    return 1;
  char path[4096], prefix[16], line[1024];
  snprintf(path, sizeof(path), "%s/MANIFEST", argv[1]);
  snprintf(prefix, sizeof(prefix), "v%d_", KVT_FORMAT_VERSION);
  FILE *m = fopen(path, "a+"); /* older versions' lines stay */
  if (!m) {
    perror(path);
    kvt_ctx_destroy(ctx);
    return 1;
  }
  int empty = 1;
  rewind(m);
  while (fgets(line, sizeof(line), m)) {
    empty = 0;
    if (KVT_FORMAT_VERSION < 2 || strncmp(line, prefix, strlen(prefix)) == 0) {
      fprintf(stderr, "%s already lists format %d's golden files: they are never rewritten\n",
              path, KVT_FORMAT_VERSION);
      fclose(m);
      kvt_ctx_destroy(ctx);
      return 1;
    }
  }
  if (empty)
    fprintf(m, "# Golden payloads: written by tests/golden/make_golden.c, checked by "
               "tests/test_golden.c.\n# Columns: see tests/golden/golden_common.h.\n");
  int rc = 0;
  for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]) && rc == 0; i++)
    rc = make_one(ctx, argv[1], &defs[i], m);
  if (fclose(m) != 0)
    rc = -EIO;
  kvt_ctx_destroy(ctx);
  return rc ? 1 : 0;
}
