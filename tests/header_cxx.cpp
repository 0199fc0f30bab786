// tests/header_cxx.cpp - the public header compiles as C++ and links.
#include "kvtier.h"

#include <cstdio>

int main() {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  kvt_ctx *ctx = nullptr;
  if (kvt_ctx_create(&cfg, &ctx) != 0)
    return 1;
  kvt_codec_spec spec;
  int rc = kvt_codec_parse(ctx, "k16v8", &spec);
  kvt_ctx_destroy(ctx);
  std::printf("kvtier %s from C++: %s\n", kvt_version_string(), kvt_err_name(rc));
  return rc == 0 ? 0 : 1;
}
