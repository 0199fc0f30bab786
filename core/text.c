/* core/text.c - small text helpers the spec parsers share (the redis tier's
 * URL and `kvtier bench redis`, which must read a URL exactly as the tier
 * does). */
#include "kvt_internal.h"

static int hexval(char ch) {
  return ch >= '0' && ch <= '9'   ? ch - '0'
         : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                  : -1;
}

int kvt_url_unescape(char *dst, size_t cap, const char *src, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    char ch = src[i];
    if (ch == '%') {
      const int hi = i + 2 < n ? hexval(src[i + 1]) : -1, lo = i + 2 < n ? hexval(src[i + 2]) : -1;
      if (hi < 0 || lo < 0 || (hi | lo) == 0)
        return -1;
      ch = (char)(hi << 4 | lo);
      i += 2;
    }
    if (k + 1 >= cap)
      return -1;
    dst[k++] = ch;
  }
  if (!cap)
    return -1;
  dst[k] = '\0';
  return 0;
}
