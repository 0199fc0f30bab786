/* tests/install/consumer.c - a program built against an installed kvtier. */
#include <kvtier.h>
#include <stdio.h>
int main(void){ kvt_ctx *c; if (kvt_ctx_create(NULL,&c)) return 1; kvt_codec_spec s; int rc = kvt_codec_parse(c,"k16v8",&s); printf("%s %s\n", kvt_version_string(), kvt_err_name(rc)); kvt_ctx_destroy(c); return rc; }
