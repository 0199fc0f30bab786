/* tests/install/consumer.c - a program built against an installed kvtier. It
 * calls a GPU entry point too, so a static link pulls in the GPU objects (and,
 * in a CUDA build, the CUDA runtime they need); without a GPU or without CUDA
 * that call fails cleanly and the program still succeeds. */
#include <kvtier.h>
#include <kvtier/gpu.h>
#include <stdio.h>
int main(void) {
  kvt_ctx *c;
  if (kvt_ctx_create(NULL, &c))
    return 1;
  kvt_codec_spec s;
  int rc = kvt_codec_parse(c, "k16v8", &s);
  int kind = -1;
  int g = kvt_gpu_mem_kind(c, &s, &kind);
  printf("%s %s gpu:%s\n", kvt_version_string(), kvt_err_name(rc), kvt_err_name(g));
  kvt_ctx_destroy(c);
  return rc;
}
