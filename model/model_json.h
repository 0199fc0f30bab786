/* model/model_json.h - a small, strict JSON reader for what the bandwidth
 * model reads: Hugging Face config.json files and JSON Lines of
 * measurements. kvt_json_parse() validates a whole document (RFC 8259,
 * depth-limited, every offset checked against the length) once; the
 * accessors then walk the validated text without allocating. Values are
 * spans of the caller's buffer, which must outlive them. */
#ifndef KVT_MODEL_JSON_H
#define KVT_MODEL_JSON_H

#include <stddef.h>

#include "kvtier/core.h"

#define KVT_JSON_MAX_DEPTH 64

enum kvt_json_type {
  KVT_JSON_NULL = 1,
  KVT_JSON_BOOL,
  KVT_JSON_NUMBER,
  KVT_JSON_STRING,
  KVT_JSON_ARRAY,
  KVT_JSON_OBJECT
};

typedef struct kvt_json {
  const char *p; /* first byte of the value */
  size_t n;      /* bytes of the value */
  int type;      /* enum kvt_json_type */
} kvt_json;

/* Validates text[0..len) as exactly one JSON value (whitespace around it
 * allowed) and sets *root. Returns 0, or KVT_ECORRUPT with the offset and
 * what was expected in ctx (may be NULL); nesting deeper than
 * KVT_JSON_MAX_DEPTH is KVT_ETOOBIG. */
int kvt_json_parse(kvt_ctx *ctx, const char *text, size_t len, kvt_json *root);

/* Member key of an object (the first, if repeated). Returns 0 or
 * KVT_ENOTFOUND (also when obj is not an object). */
int kvt_json_member(const kvt_json *obj, const char *key, kvt_json *out);

/* Iterates an array's elements or an object's values: *pos starts at 0.
 * Returns 1 with *out (and *key, when key is not NULL and obj is an object)
 * set, or 0 at the end. */
int kvt_json_next(const kvt_json *v, size_t *pos, kvt_json *key, kvt_json *out);

/* The number v holds, into *out. Returns 0, KVT_ENOTFOUND when v is not a
 * number, or KVT_ERANGE when it overflows a double. */
int kvt_json_number(const kvt_json *v, double *out);

/* A number that is a whole value in [min, max] (1e3 counts; 2.5 does not).
 * Returns 0, KVT_ENOTFOUND (not a number) or KVT_ERANGE. */
int kvt_json_uint(const kvt_json *v, double max, unsigned long long *out);

/* The string v holds, unescaped (\uXXXX to UTF-8, surrogate pairs joined),
 * NUL-terminated into buf[0..cap). Returns 0, KVT_ENOTFOUND (not a string)
 * or KVT_ENOBUFS (then buf holds a truncated prefix). */
int kvt_json_string(const kvt_json *v, char *buf, size_t cap);

/* Whether v is the string s (after unescaping). */
int kvt_json_is(const kvt_json *v, const char *s);

#endif
