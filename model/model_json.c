/* model/model_json.c - the strict JSON reader behind kvt_model_from_hf_config
 * and `kvtier project fit|saturation`. One validating pass (recursive
 * descent, depth-limited, UTF-8 checked, every index compared with the
 * length before it is read); the accessors then rely on that validation and
 * walk the text without allocating. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_internal.h"
#include "model_json.h"

typedef struct jp {
  kvt_ctx *ctx;
  const char *s;
  size_t n, i;
} jp;

static int at_end(const jp *p) { return p->i >= p->n; }
static unsigned char cur(const jp *p) { return (unsigned char)p->s[p->i]; }

static int bad(jp *p, const char *what) {
  if (at_end(p))
    return kvt_fail(p->ctx, KVT_ECORRUPT, "JSON truncated at offset %zu: expected %s", p->i,
                    what);
  return kvt_fail(p->ctx, KVT_ECORRUPT, "JSON offset %zu: expected %s", p->i, what);
}

static void skip_ws(jp *p) {
  while (!at_end(p) && (cur(p) == ' ' || cur(p) == '\t' || cur(p) == '\n' || cur(p) == '\r'))
    p->i++;
}

static int is_hex(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One UTF-8 sequence of 2..4 bytes starting at p->i (a byte >= 0x80):
 * shortest form only, no surrogates, at most U+10FFFF. */
static int utf8_seq(jp *p) {
  const unsigned char c = cur(p);
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    lo = c == 0xE0 ? 0xA0 : 0x80;
    hi = c == 0xED ? 0x9F : 0xBF;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    lo = c == 0xF0 ? 0x90 : 0x80;
    hi = c == 0xF4 ? 0x8F : 0xBF;
  } else {
    return bad(p, "valid UTF-8");
  }
  if (p->n - p->i < len)
    return bad(p, "a complete UTF-8 sequence");
  for (size_t k = 1; k < len; k++) {
    const unsigned char b = (unsigned char)p->s[p->i + k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF))
      return bad(p, "valid UTF-8");
  }
  p->i += len;
  return 0;
}

static int parse_string(jp *p) {
  p->i++; /* the opening quote, checked by the caller */
  for (;;) {
    if (at_end(p))
      return bad(p, "'\"' closing a string");
    const unsigned char c = cur(p);
    if (c == '"') {
      p->i++;
      return 0;
    }
    if (c < 0x20)
      return bad(p, "no control character inside a string");
    if (c >= 0x80) {
      int rc = utf8_seq(p);
      if (rc)
        return rc;
      continue;
    }
    p->i++;
    if (c != '\\')
      continue;
    if (at_end(p))
      return bad(p, "an escape");
    const unsigned char e = cur(p);
    p->i++;
    if (e == 'u') {
      for (int k = 0; k < 4; k++, p->i++)
        if (at_end(p) || !is_hex(cur(p)))
          return bad(p, "four hex digits after \\u");
    } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
      p->i--;
      return bad(p, "a valid escape");
    }
  }
}

static int digits(jp *p) {
  const size_t start = p->i;
  while (!at_end(p) && cur(p) >= '0' && cur(p) <= '9')
    p->i++;
  return p->i > start ? 0 : bad(p, "a digit");
}

static int parse_number(jp *p) {
  if (cur(p) == '-')
    p->i++;
  if (at_end(p))
    return bad(p, "a digit");
  if (cur(p) == '0')
    p->i++;
  else if (digits(p))
    return KVT_ECORRUPT;
  if (!at_end(p) && cur(p) == '.') {
    p->i++;
    if (digits(p))
      return KVT_ECORRUPT;
  }
  if (!at_end(p) && (cur(p) == 'e' || cur(p) == 'E')) {
    p->i++;
    if (!at_end(p) && (cur(p) == '+' || cur(p) == '-'))
      p->i++;
    if (digits(p))
      return KVT_ECORRUPT;
  }
  return 0;
}

static int parse_literal(jp *p, const char *word) {
  const size_t len = strlen(word);
  if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0)
    return bad(p, "a value");
  p->i += len;
  return 0;
}

static int parse_value(jp *p, int depth);

/* Elements of an array or members of an object, after the bracket. */
static int parse_container(jp *p, int depth, int object) {
  const char close = object ? '}' : ']';
  p->i++;
  skip_ws(p);
  if (!at_end(p) && cur(p) == (unsigned char)close) {
    p->i++;
    return 0;
  }
  for (;;) {
    int rc;
    if (object) {
      if (at_end(p) || cur(p) != '"')
        return bad(p, "a member name");
      if ((rc = parse_string(p)) != 0)
        return rc;
      skip_ws(p);
      if (at_end(p) || cur(p) != ':')
        return bad(p, "':'");
      p->i++;
    }
    if ((rc = parse_value(p, depth + 1)) != 0)
      return rc;
    skip_ws(p);
    if (at_end(p))
      return bad(p, object ? "',' or '}'" : "',' or ']'");
    if (cur(p) == (unsigned char)close) {
      p->i++;
      return 0;
    }
    if (cur(p) != ',')
      return bad(p, object ? "',' or '}'" : "',' or ']'");
    p->i++;
    skip_ws(p);
  }
}

static int parse_value(jp *p, int depth) {
  skip_ws(p);
  if (at_end(p))
    return bad(p, "a value");
  switch (cur(p)) {
  case '{':
  case '[':
    if (depth >= KVT_JSON_MAX_DEPTH)
      return kvt_fail(p->ctx, KVT_ETOOBIG, "JSON offset %zu: nesting deeper than %d", p->i,
                      KVT_JSON_MAX_DEPTH);
    return parse_container(p, depth, cur(p) == '{');
  case '"':
    return parse_string(p);
  case 't':
    return parse_literal(p, "true");
  case 'f':
    return parse_literal(p, "false");
  case 'n':
    return parse_literal(p, "null");
  default:
    if (cur(p) == '-' || (cur(p) >= '0' && cur(p) <= '9'))
      return parse_number(p);
    return bad(p, "a value");
  }
}

static int type_of(char c) {
  switch (c) {
  case '{':
    return KVT_JSON_OBJECT;
  case '[':
    return KVT_JSON_ARRAY;
  case '"':
    return KVT_JSON_STRING;
  case 't':
  case 'f':
    return KVT_JSON_BOOL;
  case 'n':
    return KVT_JSON_NULL;
  default:
    return KVT_JSON_NUMBER;
  }
}

int kvt_json_parse(kvt_ctx *ctx, const char *text, size_t len, kvt_json *root) {
  jp p = {ctx, text, text ? len : 0, 0};
  if (!text || !root)
    return kvt_fail(ctx, KVT_ECORRUPT, "no JSON text");
  skip_ws(&p);
  const size_t start = p.i;
  int rc = parse_value(&p, 0);
  if (rc)
    return rc;
  const size_t end = p.i;
  skip_ws(&p);
  if (!at_end(&p))
    return bad(&p, "the end of the text after one value");
  root->p = text + start;
  root->n = end - start;
  root->type = type_of(text[start]);
  return 0;
}

/* End (exclusive) of the validated value starting at s[i], s[0..n). */
static size_t skip_value(const char *s, size_t n, size_t i) {
  const char c = s[i];
  if (c == '"') {
    for (i++; i < n && s[i] != '"'; i++)
      if (s[i] == '\\')
        i++;
    return i + 1;
  }
  if (c == '{' || c == '[') {
    int depth = 0, in_str = 0;
    for (; i < n; i++) {
      if (in_str) {
        if (s[i] == '\\')
          i++;
        else if (s[i] == '"')
          in_str = 0;
      } else if (s[i] == '"') {
        in_str = 1;
      } else if (s[i] == '{' || s[i] == '[') {
        depth++;
      } else if ((s[i] == '}' || s[i] == ']') && --depth == 0) {
        return i + 1;
      }
    }
    return n;
  }
  while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
         s[i] != '\n' && s[i] != '\r')
    i++;
  return i;
}

static size_t skip_ws_at(const char *s, size_t n, size_t i) {
  while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
    i++;
  return i;
}

int kvt_json_next(const kvt_json *v, size_t *pos, kvt_json *key, kvt_json *out) {
  if (!v || !pos || !out || (v->type != KVT_JSON_ARRAY && v->type != KVT_JSON_OBJECT))
    return 0;
  const char *s = v->p;
  const size_t n = v->n;
  size_t i = skip_ws_at(s, n, *pos == 0 ? 1 : *pos);
  if (i < n && s[i] == ',')
    i = skip_ws_at(s, n, i + 1);
  if (i >= n || s[i] == ']' || s[i] == '}')
    return 0;
  if (v->type == KVT_JSON_OBJECT) {
    const size_t kend = skip_value(s, n, i);
    if (key) {
      key->p = s + i;
      key->n = kend - i;
      key->type = KVT_JSON_STRING;
    }
    i = skip_ws_at(s, n, kend);
    i = skip_ws_at(s, n, i + 1); /* the ':' */
  }
  const size_t end = skip_value(s, n, i);
  out->p = s + i;
  out->n = end - i;
  out->type = type_of(s[i]);
  *pos = end;
  return 1;
}

int kvt_json_member(const kvt_json *obj, const char *key, kvt_json *out) {
  if (!obj || obj->type != KVT_JSON_OBJECT)
    return KVT_ENOTFOUND;
  size_t pos = 0;
  kvt_json k, v;
  while (kvt_json_next(obj, &pos, &k, &v))
    if (kvt_json_is(&k, key)) {
      *out = v;
      return 0;
    }
  return KVT_ENOTFOUND;
}

int kvt_json_number(const kvt_json *v, double *out) {
  if (!v || v->type != KVT_JSON_NUMBER)
    return KVT_ENOTFOUND;
  char buf[512];
  if (v->n >= sizeof(buf))
    return KVT_ERANGE;
  memcpy(buf, v->p, v->n);
  buf[v->n] = '\0';
  errno = 0;
  const double x = strtod(buf, NULL);
  if (!isfinite(x))
    return KVT_ERANGE;
  *out = x;
  return 0;
}

int kvt_json_uint(const kvt_json *v, double max, unsigned long long *out) {
  double x;
  int rc = kvt_json_number(v, &x);
  if (rc)
    return rc;
  if (x < 0 || x > max || floor(x) != x)
    return KVT_ERANGE;
  *out = (unsigned long long)x;
  return 0;
}

static unsigned hex4(const char *s) {
  unsigned u = 0;
  for (int k = 0; k < 4; k++) {
    const char c = s[k];
    u = u * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  }
  return u;
}

/* Appends code point u as UTF-8; returns bytes written, 0 if it does not fit. */
static size_t put_utf8(char *b, size_t room, unsigned u) {
  unsigned char t[4];
  size_t len;
  if (u < 0x80) {
    t[0] = (unsigned char)u;
    len = 1;
  } else if (u < 0x800) {
    t[0] = (unsigned char)(0xC0 | u >> 6);
    t[1] = (unsigned char)(0x80 | (u & 0x3F));
    len = 2;
  } else if (u < 0x10000) {
    t[0] = (unsigned char)(0xE0 | u >> 12);
    t[1] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
    t[2] = (unsigned char)(0x80 | (u & 0x3F));
    len = 3;
  } else {
    t[0] = (unsigned char)(0xF0 | u >> 18);
    t[1] = (unsigned char)(0x80 | ((u >> 12) & 0x3F));
    t[2] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
    t[3] = (unsigned char)(0x80 | (u & 0x3F));
    len = 4;
  }
  if (len > room)
    return 0;
  memcpy(b, t, len);
  return len;
}

static unsigned escaped(char e) {
  switch (e) {
  case 'b':
    return '\b';
  case 'f':
    return '\f';
  case 'n':
    return '\n';
  case 'r':
    return '\r';
  case 't':
    return '\t';
  default:
    return (unsigned char)e; /* " \ / */
  }
}

int kvt_json_string(const kvt_json *v, char *buf, size_t cap) {
  if (!v || v->type != KVT_JSON_STRING || !buf || cap == 0)
    return KVT_ENOTFOUND;
  const char *s = v->p + 1, *end = v->p + v->n - 1; /* inside the quotes */
  size_t o = 0;
  while (s < end) {
    unsigned u;
    if (*s != '\\') {
      u = (unsigned char)*s++;
      if (o + 1 >= cap)
        goto full;
      buf[o++] = (char)u;
      continue;
    }
    if (s[1] != 'u') {
      u = escaped(s[1]);
      s += 2;
    } else {
      u = hex4(s + 2);
      s += 6;
      if (u >= 0xD800 && u <= 0xDBFF && end - s >= 6 && s[0] == '\\' && s[1] == 'u') {
        const unsigned lo = hex4(s + 2);
        if (lo >= 0xDC00 && lo <= 0xDFFF) {
          u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
          s += 6;
        }
      }
      if (u >= 0xD800 && u <= 0xDFFF)
        u = 0xFFFD; /* a lone surrogate */
    }
    const size_t w = put_utf8(buf + o, cap - 1 - o, u);
    if (w == 0)
      goto full;
    o += w;
  }
  buf[o] = '\0';
  return 0;
full:
  buf[o] = '\0';
  return KVT_ENOBUFS;
}

int kvt_json_is(const kvt_json *v, const char *s) {
  char buf[256];
  return v && v->type == KVT_JSON_STRING && strlen(s) < sizeof(buf) &&
         kvt_json_string(v, buf, sizeof(buf)) == 0 && strcmp(buf, s) == 0;
}
