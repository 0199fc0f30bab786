/* programs/cli_inspect.c - `kvtier inspect` (a payload's header and section
 * table, as text or JSON) and `kvtier verify` (full integrity check). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

static const char inspect_help[] =
    "Usage: kvtier inspect IN.kvt [--json]\n"
    "\n"
    "Validates the payload's header and section table (not the section bodies:\n"
    "'kvtier verify' checks those) and prints every header field (format version,\n"
    "flags, size, key, model fingerprint, canonical codec spec, dtype, model\n"
    "layers, layer range, tokens, heads, head dim, token_begin), every section\n"
    "(layer, K or V, element format, compression, offset, stored and raw bytes,\n"
    "checksum) and the ratio of the payload to the raw 16-bit K+V size.\n"
    "A bad payload exits 1 with one line: 'IN.kvt: KVT_E...: detail'.\n"
    "\n"
    "Options:\n"
    "  --json   machine-readable output (checksums as hex strings)\n";

static const char verify_help[] =
    "Usage: kvtier verify IN.kvt\n"
    "\n"
    "Checks the payload completely: magic, version, header checksum, every field,\n"
    "offset and length, every section's checksum and the padding between sections.\n"
    "Valid: prints 'IN.kvt: ok (...)' and exits 0. Invalid: prints one line,\n"
    "'IN.kvt: KVT_E...: detail', on stderr and exits 1.\n";

static const char *comp_name(int comp) {
  switch (comp) {
  case KVT_COMP_NONE:
    return "none";
  case KVT_COMP_ZSTD:
    return "zstd";
  case KVT_COMP_ZSTD_SHUFFLE16:
    return "zstd+shuffle16";
  default:
    return "?";
  }
}

static uint64_t raw16_bytes(const kvt_payload_info *in) {
  return 2ull * 2 * in->layers * in->tokens * in->heads * in->head_dim;
}

/* Reads and parses path (verify: every checksum too). Returns 0 with *buf
 * owned by the caller, or an exit code after reporting. */
static int load_payload(kvt_ctx *ctx, const char *path, int full, void **buf, size_t *len,
                        kvt_payload_info *info) {
  int rc = cli_read_file(path, buf, len);
  if (rc)
    return rc;
  int err =
      full ? kvt_payload_verify(ctx, *buf, *len, info) : kvt_payload_parse(ctx, *buf, *len, info);
  if (err == 0)
    return 0;
  rc = cli_is_payload_error(err) ? cli_report_bad_payload(path, ctx, err)
                                 : (cli_error("%s: %s", path, kvt_strerror(err)), CLI_EFAIL);
  free(*buf);
  *buf = NULL;
  return rc;
}

static void print_text(const char *path, const kvt_payload_info *in, const char *spec,
                       const kvt_section_info *secs) {
  char key[KVT_KEY_HEX_LEN + 1], fp[KVT_KEY_HEX_LEN + 1];
  const uint64_t raw = raw16_bytes(in);
  int lossless = 0;
  for (uint32_t i = 0; i < in->sections; i++)
    lossless |= secs[i].comp != KVT_COMP_NONE;
  printf("%s: kvtier payload, format %u.%u, %" PRIu64 " bytes\n", path, in->version_major,
         in->version_minor, in->size);
  printf("  flags          0x%08" PRIx32 "%s\n", in->flags,
         lossless ? " (lossless stage used)" : "");
  printf("  header size    %" PRIu32 " bytes\n", in->header_size);
  printf("  key            %s\n", kvt_key_hex(&in->key, key));
  printf("  fingerprint    %s\n", kvt_key_hex(&in->fingerprint, fp));
  printf("  codec          %s\n", spec);
  printf("  dtype          %s\n", kvt_dtype_name(in->dtype));
  printf("  model layers   %" PRIu32 "\n", in->model_layers);
  printf("  layer range    %" PRIu32 "..%" PRIu32 " (%" PRIu32 " layers)\n", in->layer_begin,
         in->layer_begin + in->layers - 1, in->layers);
  printf("  tokens         %" PRIu32 " (token_begin %" PRIu32 ")\n", in->tokens, in->token_begin);
  printf("  heads          %" PRIu32 "\n", in->heads);
  printf("  head dim       %" PRIu32 "\n", in->head_dim);
  printf("  raw 16-bit     %" PRIu64 " bytes (K+V)\n", raw);
  printf("  ratio          %.4f of raw 16-bit (%.2fx capacity)\n", (double)in->size / (double)raw,
         (double)raw / (double)in->size);
  printf("  sections       %" PRIu32 "\n\n", in->sections);
  printf("  %5s %6s %2s %-5s %-14s %12s %12s %12s %s\n", "#", "layer", "kv", "fmt", "compression",
         "offset", "stored", "raw", "checksum");
  for (uint32_t i = 0; i < in->sections; i++) {
    const kvt_section_info *s = &secs[i];
    printf("  %5" PRIu32 " %6" PRIu32 " %2s %-5s %-14s %12" PRIu64 " %12" PRIu64 " %12" PRIu64
           " %016" PRIx64 "\n",
           i, s->layer, s->is_value ? "V" : "K", kvt_fmt_name(s->fmt), comp_name(s->comp),
           s->offset, s->stored_size, s->raw_size, s->checksum);
  }
}

static void print_json(const char *path, const kvt_payload_info *in, const char *spec,
                       const kvt_section_info *secs) {
  char key[KVT_KEY_HEX_LEN + 1], fp[KVT_KEY_HEX_LEN + 1];
  const uint64_t raw = raw16_bytes(in);
  printf("{\"file\": ");
  cli_json_str(stdout, path);
  printf(", \"version_major\": %u, \"version_minor\": %u, \"flags\": %" PRIu32
         ", \"size\": %" PRIu64 ", \"header_size\": %" PRIu32 ",\n",
         in->version_major, in->version_minor, in->flags, in->size, in->header_size);
  printf(" \"key\": \"%s\", \"fingerprint\": \"%s\", \"codec\": ", kvt_key_hex(&in->key, key),
         kvt_key_hex(&in->fingerprint, fp));
  cli_json_str(stdout, spec);
  printf(", \"dtype\": \"%s\",\n \"model_layers\": %" PRIu32 ", \"layer_begin\": %" PRIu32
         ", \"layers\": %" PRIu32 ", \"tokens\": %" PRIu32 ", \"heads\": %" PRIu32
         ", \"head_dim\": %" PRIu32 ", \"token_begin\": %" PRIu32 ",\n",
         kvt_dtype_name(in->dtype), in->model_layers, in->layer_begin, in->layers, in->tokens,
         in->heads, in->head_dim, in->token_begin);
  printf(" \"raw_bytes\": %" PRIu64 ", \"ratio\": %.6f,\n \"sections\": [", raw,
         (double)in->size / (double)raw);
  for (uint32_t i = 0; i < in->sections; i++) {
    const kvt_section_info *s = &secs[i];
    printf("%s\n  {\"index\": %" PRIu32 ", \"layer\": %" PRIu32
           ", \"kv\": \"%s\", \"fmt\": \"%s\", \"compression\": \"%s\", \"offset\": %" PRIu64
           ", \"stored_bytes\": %" PRIu64 ", \"raw_bytes\": %" PRIu64
           ", \"checksum\": \"%016" PRIx64 "\"}",
           i ? "," : "", i, s->layer, s->is_value ? "V" : "K", kvt_fmt_name(s->fmt),
           comp_name(s->comp), s->offset, s->stored_size, s->raw_size, s->checksum);
  }
  printf("]}\n");
}

static int inspect_run(kvt_ctx *ctx, const char *path, int json) {
  void *buf;
  size_t len;
  kvt_payload_info info;
  int rc = load_payload(ctx, path, 0, &buf, &len, &info);
  if (rc)
    return rc;
  kvt_section_info *secs = calloc(info.sections ? info.sections : 1, sizeof(*secs));
  if (!secs) {
    cli_error("out of memory");
    free(buf);
    return CLI_EFAIL;
  }
  for (uint32_t i = 0; i < info.sections && !rc; i++) {
    int err = kvt_payload_section(ctx, buf, len, i, &secs[i]);
    if (err)
      rc = cli_is_payload_error(err)
               ? cli_report_bad_payload(path, ctx, err)
               : (cli_error("%s: section %u: %s", path, i, kvt_strerror(err)), CLI_EFAIL);
  }
  char spec[KVT_CODEC_SPEC_TEXT_MAX];
  if (!rc && kvt_codec_format(&info.spec, spec, sizeof(spec)) != 0)
    snprintf(spec, sizeof(spec), "?");
  if (!rc && json)
    print_json(path, &info, spec, secs);
  else if (!rc)
    print_text(path, &info, spec, secs);
  free(secs);
  free(buf);
  return rc;
}

/* Shared by inspect and verify: one payload path, an optional --json. */
static int parse_one(const char *cmd, const char *help, int argc, char **argv, int *json,
                     const char **path) {
  const cli_opt opts[] = {{"--json", NULL, CLI_FLAG, json, 0, 0}};
  size_t n_pos;
  int rc = cli_parse(cmd, argc, argv, opts, json ? 1 : 0, path, 1, &n_pos);
  if (rc == CLI_HELP) {
    fputs(help, stdout);
    return CLI_HELP;
  }
  if (rc)
    return rc;
  if (n_pos != 1)
    return cli_usage_error(cmd, "name one payload file");
  return 0;
}

int cli_inspect_main(int argc, char **argv) {
  int json = 0;
  const char *path = NULL;
  int rc = parse_one("inspect", inspect_help, argc, argv, &json, &path);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  kvt_ctx *ctx;
  if ((rc = cli_ctx_create(KVT_SIMD_AUTO, &ctx)))
    return rc;
  rc = inspect_run(ctx, path, json);
  kvt_ctx_destroy(ctx);
  return rc;
}

int cli_verify_main(int argc, char **argv) {
  const char *path = NULL;
  int rc = parse_one("verify", verify_help, argc, argv, NULL, &path);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  kvt_ctx *ctx;
  if ((rc = cli_ctx_create(KVT_SIMD_AUTO, &ctx)))
    return rc;
  void *buf;
  size_t len;
  kvt_payload_info in;
  rc = load_payload(ctx, path, 1, &buf, &len, &in);
  if (rc == 0) {
    char spec[KVT_CODEC_SPEC_TEXT_MAX], key[KVT_KEY_HEX_LEN + 1];
    if (kvt_codec_format(&in.spec, spec, sizeof(spec)) != 0)
      snprintf(spec, sizeof(spec), "?");
    printf("%s: ok (%zu bytes, %s, %s, layers %u..%u of %u, %u tokens x %u heads x %u dim, "
           "%u sections, key %s)\n",
           path, len, spec, kvt_dtype_name(in.dtype), in.layer_begin,
           in.layer_begin + in.layers - 1, in.model_layers, in.tokens, in.heads, in.head_dim,
           in.sections, kvt_key_hex(&in.key, key));
    free(buf);
  }
  kvt_ctx_destroy(ctx);
  return rc;
}
