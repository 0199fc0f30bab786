/* programs/cli_codec.c - `kvtier encode` (raw K/V files to a payload) and
 * `kvtier decode` (a payload back to raw K/V files). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

static const char encode_help[] =
    "Usage: kvtier encode --codec SPEC --dtype bf16|fp16 --layers L --tokens T --heads H\n"
    "                     --head-dim D --k K.bin --v V.bin -o OUT.kvt [OPTIONS]\n"
    "\n"
    "Encodes one chunk of KV into a payload. K.bin and V.bin hold raw little-endian\n"
    "16-bit values (bf16 or fp16) in [layer][token][head][dim] order, L*T*H*D*2\n"
    "bytes each.\n"
    "\n"
    "Options:\n"
    "  --codec SPEC          codec spec: a preset (raw k16v8 fp8 int8 k16v4 k8v4 int4)\n"
    "                        or the general form ('kvtier --help')\n"
    "  --dtype bf16|fp16     element type of K.bin and V.bin\n"
    "  --layers L            layers in the files (the payload's layer range)\n"
    "  --tokens T            tokens in the chunk\n"
    "  --heads H             KV heads\n"
    "  --head-dim D          elements per head vector\n"
    "  --k K.bin, --v V.bin  the input files\n"
    "  -o, --output OUT.kvt  the payload; see 'Output' below\n"
    "  --model-id ID         model identity for the fingerprint (default unknown-model)\n"
    "  --layer-begin N       absolute index of the files' first layer (default 0)\n"
    "  --model-layers N      layers of the whole model (default layer-begin + L)\n"
    "  --zstd LEVEL          lossless zstd stage, level 1..19, kept per section only\n"
    "                        where it saves at least 3% (default 0: off)\n"
    "  --tokens-file IDS     token ids as raw little-endian u32: the sequence up to and\n"
    "                        including this chunk, a multiple of T ids. Keys chain over\n"
    "                        every chunk of T ids; this chunk is the last, and its\n"
    "                        token_begin is its position. Without this option the key\n"
    "                        is that of a first chunk holding token ids 0..T-1.\n"
    "\n"
    "The fingerprint is kvt_fingerprint over the model id, dtype, model layers, heads,\n"
    "head dim, tensor-parallel rank 0 of 1 and the codec. Prints the payload's size,\n"
    "its ratio to the raw 16-bit size, and its key.\n"
    "\n"
    "Output: a new or regular OUT.kvt, or the file a symlink OUT.kvt leads to (the\n"
    "link stays), is replaced atomically: a temporary file beside it is written,\n"
    "fsync'd and renamed over it, so a failure never leaves a partial file.\n"
    "A device or FIFO is written in place and never replaced (/dev/null discards;\n"
    "/dev/full fails: exit 3); so is /dev/stdout or /dev/fd/N, through that\n"
    "descriptor, whatever it is open on. A symlink another user made in a sticky\n"
    "directory (/tmp) is not followed (exit 3). -o naming an input file, or an\n"
    "empty path, is a usage error (exit 2).\n"
    "\n"
    "Exit status: 0 success, 2 usage error (bad option, an input whose size does not\n"
    "match the shape), 3 a file could not be read or written, 4 any other failure.\n";

static const char decode_help[] =
    "Usage: kvtier decode IN.kvt --k K.bin --v V.bin\n"
    "\n"
    "Verifies IN.kvt (header and every section checksum before it is read) and\n"
    "decodes all its layers into K.bin and V.bin: raw little-endian 16-bit values of\n"
    "the payload's dtype in [layer][token][head][dim] order, the layout 'kvtier\n"
    "encode' reads.\n"
    "\n"
    "Output: both files are written or neither. A new or regular file, or the\n"
    "file a symlink leads to (the link stays), is replaced atomically: a temporary\n"
    "file beside it is written and fsync'd, and the two are renamed into place only\n"
    "once both are written, so a failure leaves no new file and every file that\n"
    "was there as it was. A device or FIFO is written in place and never replaced\n"
    "(/dev/null discards; /dev/full fails: exit 3); so is /dev/stdout or /dev/fd/N,\n"
    "through that descriptor. A symlink another user made in a sticky directory\n"
    "(/tmp) is not followed (exit 3). --k or --v naming the payload\n"
    "file, --k and --v naming one regular file, or an empty path, is a usage\n"
    "error (exit 2).\n"
    "\n"
    "Exit status: 0 success; 1 a bad payload, with one line 'IN.kvt: KVT_E...:\n"
    "detail'; 2 usage error; 3 a file could not be read or written; 4 any other\n"
    "failure.\n";

typedef struct encode_args {
  const char *codec, *dtype_s, *k_path, *v_path, *out, *model_id, *tokens_file;
  uint32_t layers, tokens, heads, head_dim, layer_begin, model_layers;
  int zstd, dtype;
} encode_args;

static int encode_check_args(encode_args *a) {
  static const char *const names[] = {"--codec",    "--dtype", "--layers", "--tokens", "--heads",
                                      "--head-dim", "--k",     "--v",      "-o"};
  const int given[] = {a->codec != NULL,  a->dtype_s != NULL, a->layers != 0,
                       a->tokens != 0,    a->heads != 0,      a->head_dim != 0,
                       a->k_path != NULL, a->v_path != NULL,  a->out != NULL};
  for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); i++)
    if (!given[i])
      return cli_usage_error("encode", "%s is required", names[i]);
  int rc = cli_check_output("encode", "-o", a->out);
  if (rc)
    return rc;
  const char *const inputs[] = {a->k_path, a->v_path, a->tokens_file};
  for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++)
    if (inputs[i] && cli_same_file(a->out, inputs[i]))
      return cli_usage_error("encode", "-o '%s' and the input '%s' are the same file", a->out,
                             inputs[i]);
  a->dtype = cli_parse_dtype(a->dtype_s);
  if (a->dtype < 0)
    return cli_usage_error("encode", "--dtype: expected bf16 or fp16, got '%s'", a->dtype_s);
  if (a->model_layers == 0)
    a->model_layers = a->layer_begin + a->layers;
  if ((uint64_t)a->layer_begin + a->layers > a->model_layers)
    return cli_usage_error("encode", "layers %u..%u do not fit a %u-layer model", a->layer_begin,
                           a->layer_begin + a->layers - 1, a->model_layers);
  if (a->zstd && !kvt_has_feature("zstd"))
    return cli_usage_error("encode", "--zstd: this build has no zstd");
  return 0;
}

/* The chunk key: chained over the ids of --tokens-file, or over 0..T-1. */
static int encode_key(const encode_args *a, const kvt_key *fp, kvt_key *key,
                      uint32_t *token_begin) {
  const size_t T = a->tokens;
  if (!a->tokens_file) {
    uint32_t *ids = malloc(T * sizeof(*ids));
    if (!ids) {
      cli_error("out of memory");
      return CLI_EFAIL;
    }
    for (uint32_t i = 0; i < T; i++)
      ids[i] = i;
    int rc = kvt_chunk_key(fp, NULL, ids, T, key);
    free(ids);
    *token_begin = 0;
    return rc ? (cli_error("chunk key: %s", kvt_strerror(rc)), CLI_EFAIL) : 0;
  }
  void *buf;
  size_t len;
  int rc = cli_read_file(a->tokens_file, &buf, &len);
  if (rc)
    return rc;
  const size_t n = len / 4, n_chunks = n / T;
  if (len == 0 || len % (4 * T) || n - T > UINT32_MAX) {
    cli_error("%s: expected a non-zero multiple of %zu bytes (%zu tokens x 4 bytes), file has %zu",
              a->tokens_file, 4 * T, T, len);
    free(buf);
    return CLI_EUSAGE;
  }
  uint32_t *ids = buf; /* little-endian u32s; the library builds only on LE hosts */
  kvt_key *keys = malloc(n_chunks * sizeof(*keys));
  size_t got = 0;
  rc = keys ? kvt_chunk_keys(fp, ids, n, a->tokens, keys, n_chunks, &got) : -1;
  if (rc == 0 && got == n_chunks) {
    *key = keys[n_chunks - 1];
    *token_begin = (uint32_t)(n - T);
  } else {
    cli_error("chunk keys: %s", keys ? kvt_strerror(rc) : "out of memory");
    rc = CLI_EFAIL;
  }
  free(keys);
  free(buf);
  return rc ? CLI_EFAIL : 0;
}

static int encode_params(kvt_ctx *ctx, const encode_args *a, kvt_encode_params *p) {
  int rc = kvt_codec_parse(ctx, a->codec, &p->spec);
  if (rc)
    return cli_usage_error("encode", "--codec '%s': %s", a->codec, kvt_ctx_last_error(ctx));
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = a->model_id;
  m.dtype = a->dtype;
  m.layers = a->model_layers;
  m.kv_heads = a->heads;
  m.head_dim = a->head_dim;
  rc = kvt_fingerprint(&m, &p->spec, &p->fingerprint);
  if (rc) {
    cli_error("fingerprint: %s", kvt_strerror(rc));
    return CLI_EFAIL;
  }
  p->model_layers = a->model_layers;
  p->layer_begin = a->layer_begin;
  p->zstd_level = a->zstd;
  return encode_key(a, &p->fingerprint, &p->key, &p->token_begin);
}

static int encode_run(kvt_ctx *ctx, const encode_args *a) {
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  int rc = encode_params(ctx, a, &p);
  if (rc)
    return rc;
  uint64_t bound;
  rc = kvt_encode_bound(ctx, &p.spec, a->layer_begin, a->layers, a->tokens, a->heads, a->head_dim,
                        &bound);
  if (rc)
    return cli_usage_error("encode", "shape %ux%ux%ux%u with codec '%s': %s", a->layers, a->tokens,
                           a->heads, a->head_dim, a->codec, kvt_strerror(rc));
  const size_t bytes = (size_t)a->layers * a->tokens * a->heads * a->head_dim * 2;
  char what[160];
  snprintf(what, sizeof(what), "%u layers x %u tokens x %u heads x %u dim x 2", a->layers,
           a->tokens, a->heads, a->head_dim);
  void *k = NULL, *v = NULL, *out = NULL;
  size_t len = 0;
  rc = cli_read_exact(a->k_path, bytes, what, &k);
  if (!rc)
    rc = cli_read_exact(a->v_path, bytes, what, &v);
  if (!rc && !(out = malloc(bound ? bound : 1))) {
    cli_error("out of memory for %" PRIu64 " bytes", bound);
    rc = CLI_EFAIL;
  }
  if (!rc) {
    kvt_kv_view view;
    kvt_kv_view_dense(&view, k, v, a->dtype, a->layers, a->tokens, a->heads, a->head_dim);
    int err = kvt_encode(ctx, &p, &view, out, bound, &len);
    if (err) {
      cli_error("encode: %s: %s", kvt_err_name(err), kvt_ctx_last_error(ctx));
      rc = err == KVT_ESHAPE || err == KVT_ESPEC ? CLI_EUSAGE : CLI_EFAIL;
    }
  }
  if (!rc)
    rc = cli_write_output(a->out, out, len);
  if (!rc) {
    char spec[KVT_CODEC_SPEC_TEXT_MAX], hex[KVT_KEY_HEX_LEN + 1];
    kvt_codec_format(&p.spec, spec, sizeof(spec));
    const char *const outs[] = {a->out};
    fprintf(cli_summary_stream(outs, 1),
            "%s: %zu bytes, %s, %.3f of raw 16-bit (%.2fx capacity), key %s\n", a->out, len, spec,
            (double)len / (2.0 * (double)bytes), 2.0 * (double)bytes / (double)len,
            kvt_key_hex(&p.key, hex));
  }
  free(out);
  free(v);
  free(k);
  return rc;
}

int cli_encode_main(int argc, char **argv) {
  encode_args a = {0};
  a.model_id = "unknown-model";
  const cli_opt opts[] = {
      {"--codec", NULL, CLI_STR, &a.codec, 0, 0},
      {"--dtype", NULL, CLI_STR, &a.dtype_s, 0, 0},
      {"--layers", NULL, CLI_U32, &a.layers, 1, KVT_MAX_LAYERS},
      {"--tokens", NULL, CLI_U32, &a.tokens, 1, KVT_MAX_TOKENS},
      {"--heads", NULL, CLI_U32, &a.heads, 1, KVT_MAX_HEADS},
      {"--head-dim", NULL, CLI_U32, &a.head_dim, 1, KVT_MAX_HEAD_DIM},
      {"--k", NULL, CLI_STR, &a.k_path, 0, 0},
      {"--v", NULL, CLI_STR, &a.v_path, 0, 0},
      {"--output", "-o", CLI_STR, &a.out, 0, 0},
      {"--model-id", NULL, CLI_STR, &a.model_id, 0, 0},
      {"--layer-begin", NULL, CLI_U32, &a.layer_begin, 0, KVT_MAX_LAYERS - 1},
      {"--model-layers", NULL, CLI_U32, &a.model_layers, 1, KVT_MAX_LAYERS},
      {"--zstd", NULL, CLI_INT, &a.zstd, 0, 19},
      {"--tokens-file", NULL, CLI_STR, &a.tokens_file, 0, 0},
  };
  size_t n_pos;
  int rc = cli_parse("encode", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0, &n_pos);
  if (rc == CLI_HELP) {
    fputs(encode_help, stdout);
    return CLI_OK;
  }
  if (rc || (rc = encode_check_args(&a)))
    return rc;
  kvt_ctx *ctx;
  if ((rc = cli_ctx_create(KVT_SIMD_AUTO, &ctx)))
    return rc;
  rc = encode_run(ctx, &a);
  kvt_ctx_destroy(ctx);
  return rc;
}

static int decode_run(kvt_ctx *ctx, const char *in, const char *k_path, const char *v_path) {
  void *buf, *k = NULL, *v = NULL;
  size_t len;
  int rc = cli_read_file(in, &buf, &len);
  if (rc)
    return rc;
  kvt_payload_info info;
  int err = kvt_payload_parse(ctx, buf, len, &info);
  if (err) {
    rc = cli_is_payload_error(err) ? cli_report_bad_payload(in, ctx, err)
                                   : (cli_error("%s: %s", in, kvt_strerror(err)), CLI_EFAIL);
    free(buf);
    return rc;
  }
  const size_t bytes = (size_t)info.layers * info.tokens * info.heads * info.head_dim * 2;
  k = malloc(bytes ? bytes : 1);
  v = malloc(bytes ? bytes : 1);
  if (!k || !v) {
    cli_error("out of memory for 2 x %zu bytes", bytes);
    rc = CLI_EFAIL;
  }
  if (!rc) {
    kvt_kv_view view;
    kvt_kv_view_dense(&view, k, v, info.dtype, info.layers, info.tokens, info.heads, info.head_dim);
    err = kvt_decode(ctx, buf, len, NULL, &view);
    if (err)
      rc = cli_is_payload_error(err)
               ? cli_report_bad_payload(in, ctx, err)
               : (cli_error("%s: decode: %s: %s", in, kvt_err_name(err), kvt_ctx_last_error(ctx)),
                  CLI_EFAIL);
  }
  if (!rc) {
    const char *const paths[] = {k_path, v_path};
    const void *const bufs[] = {k, v};
    const size_t lens[] = {bytes, bytes};
    rc = cli_write_outputs(paths, bufs, lens, 2);
  }
  if (!rc)
    fprintf(cli_summary_stream((const char *const[]){k_path, v_path}, 2),
            "%s: decoded %u layers x %u tokens x %u heads x %u dim (%s) into %s and %s\n", in,
            info.layers, info.tokens, info.heads, info.head_dim, kvt_dtype_name(info.dtype), k_path,
            v_path);
  free(v);
  free(k);
  free(buf);
  return rc;
}

int cli_decode_main(int argc, char **argv) {
  const char *k_path = NULL, *v_path = NULL, *pos[1];
  const cli_opt opts[] = {
      {"--k", NULL, CLI_STR, &k_path, 0, 0},
      {"--v", NULL, CLI_STR, &v_path, 0, 0},
  };
  size_t n_pos;
  int rc = cli_parse("decode", argc, argv, opts, 2, pos, 1, &n_pos);
  if (rc == CLI_HELP) {
    fputs(decode_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  if (n_pos != 1)
    return cli_usage_error("decode", "name one payload file");
  if (!k_path || !v_path)
    return cli_usage_error("decode", "--k and --v are required");
  if ((rc = cli_check_output("decode", "--k", k_path)) ||
      (rc = cli_check_output("decode", "--v", v_path)))
    return rc;
  const char *clash = cli_same_file(pos[0], k_path)   ? k_path
                      : cli_same_file(pos[0], v_path) ? v_path
                                                      : NULL;
  if (clash)
    return cli_usage_error("decode", "%s '%s' and the payload '%s' are the same file",
                           clash == k_path ? "--k" : "--v", clash, pos[0]);
  if (cli_same_file(k_path, v_path))
    return cli_usage_error("decode", "--k '%s' and --v '%s' are the same file", k_path, v_path);
  kvt_ctx *ctx;
  if ((rc = cli_ctx_create(KVT_SIMD_AUTO, &ctx)))
    return rc;
  rc = decode_run(ctx, pos[0], k_path, v_path);
  kvt_ctx_destroy(ctx);
  return rc;
}
