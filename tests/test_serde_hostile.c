/* tests/test_serde_hostile.c - the payload parser, verifier and decoder
 * against hostile input: every bit flip, every truncation, trailing bytes,
 * each header field and section table entry edited, padding, header and
 * section checksums, crafted zstd streams, and kvt_payload_section().
 *
 * Every corruption here is re-sealed (header checksum recomputed the way
 * serde does, section checksums where the edit touches a section) so that
 * the field check itself, not a checksum, has to catch it; each expects the
 * precise error code and a detail string that names the field or offset.
 * Offsets come from serde/serde_internal.h, the authority until FORMAT.md. */
#include "serde_sample.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#ifdef KVT_HAVE_ZSTD
#include <zstd.h>
#endif

static void put(uint8_t *p, int width, uint64_t v) {
  if (width == 1)
    *p = (uint8_t)v;
  else if (width == 2)
    kvt_st16(p, (uint16_t)v);
  else if (width == 4)
    kvt_st32(p, (uint32_t)v);
  else
    kvt_st64(p, v);
}

static int is_payload_error(int rc) {
  return rc == KVT_EFORMAT || rc == KVT_EVERSION || rc == KVT_ETRUNC || rc == KVT_ECORRUPT ||
         rc == KVT_ECHECKSUM || rc == KVT_ETOOBIG;
}

/* ---- bit flips, truncation, trailing bytes ---- */

static void test_serde_parse_rejects_every_header_bit_flip(void **state) {
  (void)state;
  sample s;
  small(&s);
  uint32_t hsize = kvt_ld32(s.buf + H_HDRSIZE);
  assert_int_equal(kvt_payload_parse(ctx, s.buf, s.len, NULL), 0);
  for (size_t bit = 0; bit < 8 * (size_t)hsize; bit++) {
    s.buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    int rc = kvt_payload_parse(ctx, s.buf, s.len, NULL);
    if (!is_payload_error(rc))
      fail_msg("header bit %zu (byte %zu): parse returned %s", bit, bit / 8, kvt_err_name(rc));
    s.buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
  }
  sample_free(&s);
}

/* Names what lies at a byte, for failure messages. */
static const char *region(const uint8_t *b, size_t at) {
  uint32_t n = kvt_ld32(b + H_NSEC);
  if (at < kvt_ld32(b + H_HDRSIZE))
    return "header";
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *e = b + HDR_FIXED + (size_t)SEC_ENTRY * i;
    if (at >= kvt_ld64(e + S_OFFSET) && at < kvt_ld64(e + S_OFFSET) + kvt_ld64(e + S_STORED))
      return "a section";
  }
  return "padding between sections";
}

/* Flips every bit of s's payload, header, sections and padding alike;
 * returns how many flips went unnoticed (and says where the first was).
 * FORMAT.md section 7 leaves padding to a full verify: decode reads only
 * checksummed bytes, so its padding flips are counted apart, not missed. */
static size_t flip_every_bit(sample *s, int use_decode) {
  uint16_t *k = malloc(2 * elems(s)), *v = malloc(2 * elems(s));
  assert_true(k && v);
  assert_int_equal(kvt_payload_verify(ctx, s->buf, s->len, NULL), 0);
  assert_int_equal(decode_dense(s, s->buf, s->len, k, v), 0);
  size_t missed = 0, in_padding = 0, first = 0;
  for (size_t bit = 0; bit < 8 * s->len; bit++) {
    s->buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    int rc = use_decode ? decode_dense(s, s->buf, s->len, k, v)
                        : kvt_payload_verify(ctx, s->buf, s->len, NULL);
    int padding = region(s->buf, bit / 8)[0] == 'p';
    if (!is_payload_error(rc) && use_decode && padding)
      in_padding++;
    else if (!is_payload_error(rc) && missed++ == 0)
      first = bit;
    s->buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
  }
  if (missed)
    print_error("%s missed %zu of %zu bit flips; the first at byte %zu (%s) of a %zu-byte "
                "payload\n",
                use_decode ? "kvt_decode" : "kvt_payload_verify", missed, 8 * s->len, first / 8,
                region(s->buf, first / 8), s->len);
  if (use_decode)
    assert_true(in_padding > 0); /* each sample has padding: the walk reached it */
  free(k);
  free(v);
  return missed;
}

/* A small k16v8 payload (with padding), an fp16 int4 one, and one with
 * compressed sections. */
static void flip_every_bit_of_samples(int use_decode) {
  sample s;
  size_t missed = 0;
  small(&s);
  missed += flip_every_bit(&s, use_decode);
  sample_free(&s);
  sample_make(&s, "int4", KVT_DTYPE_F16, 2, 4, 2, 32, 0);
  missed += flip_every_bit(&s, use_decode);
  sample_free(&s);
  if (kvt_has_feature("zstd")) {
    sample_make(&s, "k16v8", KVT_DTYPE_BF16, 2, 8, 2, 32, 3);
    assert_true(kvt_ld32(s.buf + H_FLAGS) & KVT_FLAG_LOSSLESS);
    missed += flip_every_bit(&s, use_decode);
    sample_free(&s);
  }
  if (missed)
    fail_msg("%zu bit flips went unnoticed", missed);
}

static void test_serde_verify_rejects_every_bit_flip(void **state) {
  (void)state;
  flip_every_bit_of_samples(0);
}

/* Every flip in the header or a section; padding is verify's (FORMAT.md 7). */
static void test_serde_decode_rejects_every_bit_flip_outside_padding(void **state) {
  (void)state;
  flip_every_bit_of_samples(1);
}

static void test_serde_rejects_every_truncation(void **state) {
  (void)state;
  sample s;
  small(&s);
  uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
  assert_true(k && v);
  for (size_t n = 0; n < s.len; n++) {
    /* A copy of exactly n bytes, so ASan sees any read past its end. */
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    memcpy(b, s.buf, n);
    char what[64];
    snprintf(what, sizeof(what), "parse of the first %zu bytes", n);
    expect_rc(kvt_payload_parse(ctx, b, n, NULL), KVT_ETRUNC, NULL, what);
    expect_rc(kvt_payload_verify(ctx, b, n, NULL), KVT_ETRUNC, NULL, what);
    expect_rc(decode_dense(&s, b, n, k, v), KVT_ETRUNC, NULL, what);
    free(b);
  }
  expect_rc(kvt_payload_parse(ctx, NULL, 0, NULL), KVT_ETRUNC, NULL, "empty payload");
  free(k);
  free(v);
  sample_free(&s);
}

static void test_serde_rejects_short_input_without_magic_as_format(void **state) {
  (void)state;
  static const uint8_t junk[7] = {'\x89', 'K', 'V', 'X', '\r', '\n', 0x1a};
  for (size_t n = 4; n <= sizeof(junk); n++)
    expect_rc(kvt_payload_parse(ctx, junk, n, NULL), KVT_EFORMAT, "magic", "short junk");
  expect_rc(kvt_payload_parse(ctx, "GET / HTTP/1.1\r\n", 16, NULL), KVT_EFORMAT, "magic", "text");
}

static void test_serde_rejects_trailing_byte(void **state) {
  (void)state;
  sample s;
  small(&s);
  s.buf[s.len] = 0;
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len + 1, NULL), KVT_ECORRUPT,
            "1 bytes follow the payload's 1184 bytes", "one trailing byte");
  expect_rc(kvt_payload_verify(ctx, s.buf, s.len + 1, NULL), KVT_ECORRUPT, NULL, "verify");
  sample_free(&s);
}

/* ---- header fields, each re-sealed ---- */

typedef struct field_edit {
  const char *what;
  size_t off;
  int width;
  uint64_t value;
  int want;
  const char *detail;
} field_edit;

static const field_edit header_edits[] = {
    {"major version 3", H_VMAJOR, 2, 3, KVT_EVERSION, "version 3.0 at offset 8"},
    {"major version 0", H_VMAJOR, 2, 0, KVT_EVERSION, "offset 8"},
    {"bad magic", H_MAGIC + 1, 1, 'X', KVT_EFORMAT, "magic"},
    {"payload size above the limit", H_SIZE, 8, KVT_PAYLOAD_MAX + 1, KVT_ETOOBIG,
     "at offset 16 exceeds"},
    {"payload size 2^64-1", H_SIZE, 8, UINT64_MAX, KVT_ETOOBIG, "offset 16"},
    {"payload size past the buffer", H_SIZE, 8, 1184 + 64, KVT_ETRUNC, "header says 1248"},
    {"payload size short of the buffer", H_SIZE, 8, 1184 - 64, KVT_ECORRUPT, "64 bytes follow"},
    {"section count 3", H_NSEC, 4, 3, KVT_ECORRUPT, "section count 3 at offset 28"},
    {"section count 0", H_NSEC, 4, 0, KVT_ECORRUPT, "section count 0 at offset 28"},
    {"section count 8194", H_NSEC, 4, 8194, KVT_ECORRUPT, "section count 8194"},
    {"section count 6", H_NSEC, 4, 6, KVT_ECORRUPT, "header size 320 at offset 12"},
    {"header size 384", H_HDRSIZE, 4, 384, KVT_ECORRUPT, "header size 384 at offset 12"},
    {"header size 2^32-1", H_HDRSIZE, 4, UINT32_MAX, KVT_ECORRUPT, "offset 12"},
    {"unknown flag", H_FLAGS, 4, 2, KVT_ECORRUPT, "flags 0x2 at offset 24"},
    {"reserved byte 73", H_RSV0, 1, 1, KVT_ECORRUPT, "reserved header bytes"},
    {"reserved byte 75", H_RSV0 + 2, 1, 0x80, KVT_ECORRUPT, "reserved header bytes"},
    {"reserved byte 104", H_RSV1, 1, 1, KVT_ECORRUPT, "reserved header bytes"},
    {"reserved byte 119", H_RSV1 + 15, 1, 0x80, KVT_ECORRUPT, "reserved header bytes"},
    {"key format 9", H_KFMT, 1, 9, KVT_ECORRUPT, "offset 64: unknown format (k=9, v=1)"},
    {"value format 4", H_VFMT, 1, 4, KVT_ECORRUPT, "offset 64: unknown format (k=0, v=4)"},
    {"scale 3", H_SCALE, 1, 3, KVT_ECORRUPT, "offset 64: unknown scale granularity 3"},
    {"key axis 2", H_KAXIS, 1, 2, KVT_ECORRUPT, "offset 64: unknown key group axis 2"},
    {"group 0", H_GROUP, 2, 0, KVT_ECORRUPT, "offset 64: group 0"},
    {"group 33", H_GROUP, 2, 33, KVT_ECORRUPT, "offset 64: group 33"},
    {"group 65534", H_GROUP, 2, 65534, KVT_ECORRUPT, "offset 64: group 65534"},
    {"block 0", H_BLOCK, 2, 0, KVT_ECORRUPT, "offset 64: block"},
    {"dtype 7", H_DTYPE, 1, 7, KVT_ECORRUPT, "dtype 7 at offset 72"},
    {"dtype 0", H_DTYPE, 1, 0, KVT_ECORRUPT, "dtype 0 at offset 72"},
    {"dtype fp16", H_DTYPE, 1, KVT_DTYPE_F16, 0, NULL}, /* fields agree; only data differs */
    {"layer count 3", H_LCOUNT, 4, 3, KVT_ECORRUPT, "layer count 3 at offset 84"},
    {"layer count 0", H_LCOUNT, 4, 0, KVT_ECORRUPT, "layer count 0 at offset 84"},
    {"model layers 1", H_MLAYERS, 4, 1, KVT_ECORRUPT, "layers 0+2 of a 1-layer model (offset 76)"},
    {"model layers 5000", H_MLAYERS, 4, 5000, KVT_ECORRUPT, "5000-layer model"},
    {"layer begin 1", H_LBEGIN, 4, 1, KVT_ECORRUPT, "layers 1+2 of a 2-layer model"},
    {"layer begin 2^32-1", H_LBEGIN, 4, UINT32_MAX, KVT_ECORRUPT, "layers 4294967295+2"},
    {"tokens 0", H_TOKENS, 4, 0, KVT_ECORRUPT, "shape tokens 0 heads 2 head_dim 16 (offset 88)"},
    {"tokens 2^20+1", H_TOKENS, 4, (1u << 20) + 1, KVT_ECORRUPT, "tokens 1048577"},
    {"tokens 2^32-1", H_TOKENS, 4, UINT32_MAX, KVT_ECORRUPT, "tokens 4294967295"},
    {"heads 0", H_HEADS, 4, 0, KVT_ECORRUPT, "heads 0"},
    {"heads 5000", H_HEADS, 4, 5000, KVT_ECORRUPT, "heads 5000"},
    {"head_dim 0", H_HDIM, 4, 0, KVT_ECORRUPT, "head_dim 0"},
    {"head_dim 4096", H_HDIM, 4, 4096, KVT_ECORRUPT, "head_dim 4096"},
    /* Plausible shapes that the sections' sizes contradict. */
    {"tokens 5", H_TOKENS, 4, 5, KVT_ECORRUPT, "section 0 (offset 152): size 256"},
    {"heads 1", H_HEADS, 4, 1, KVT_ECORRUPT, "section 0 (offset 152): size 256"},
    {"head_dim 8", H_HDIM, 4, 8, KVT_ECORRUPT, "section 0 (offset 152)"},
};

static void test_serde_parse_names_each_bad_header_field(void **state) {
  (void)state;
  sample s;
  small(&s);
  assert_int_equal(s.len, 1184);
  size_t bad = 0;
  for (size_t i = 0; i < sizeof(header_edits) / sizeof(header_edits[0]); i++) {
    const field_edit *f = &header_edits[i];
    uint8_t *b = copy_of(&s);
    put(b + f->off, f->width, f->value);
    reseal(b, s.len);
    bad += !check_rc(kvt_payload_parse(ctx, b, s.len, NULL), f->want, f->detail, f->what);
    free(b);
  }
  sample_free(&s);
  if (bad)
    fail_msg("%zu of %zu header edits were not reported as expected", bad,
             sizeof(header_edits) / sizeof(header_edits[0]));
}

static void test_serde_parse_rejects_header_checksum_mismatch(void **state) {
  (void)state;
  sample s;
  small(&s);
  s.buf[H_CHECKSUM + 3] ^= 0x10;
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len, NULL), KVT_ECHECKSUM,
            "header checksum at offset 120", "checksum field");
  s.buf[H_CHECKSUM + 3] ^= 0x10;
  s.buf[H_TOKENS] ^= 1; /* an edit without re-sealing */
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len, NULL), KVT_ECHECKSUM, "offset 120", "field");
  sample_free(&s);
}

/* A newer minor version may give reserved bytes a meaning this reader skips. */
static void test_serde_parse_accepts_reserved_bytes_of_a_newer_minor_version(void **state) {
  (void)state;
  sample s;
  small(&s);
  kvt_st16(s.buf + H_VMINOR, KVT_FORMAT_MINOR + 1);
  s.buf[H_RSV1 + 3] = 0x5a;
  reseal(s.buf, s.len);
  kvt_payload_info info;
  assert_int_equal(kvt_payload_parse(ctx, s.buf, s.len, &info), 0);
  assert_int_equal(info.version_minor, KVT_FORMAT_MINOR + 1);
  sample_free(&s);
}

/* ... section-table reserved bytes too; header padding must stay zero. */
static void test_serde_parse_minor_versions_and_header_padding(void **state) {
  (void)state;
  sample s;
  small(&s);
  kvt_st16(s.buf + H_VMINOR, KVT_FORMAT_MINOR + 1);
  entry(s.buf, 1)[S_RSV0] = 0x11;
  reseal(s.buf, s.len);
  assert_int_equal(kvt_payload_parse(ctx, s.buf, s.len, NULL), 0);
  sample_free(&s);
  sample_make(&s, "k16v8", KVT_DTYPE_BF16, 1, 4, 2, 16, 0); /* 2 entries: 32 B of padding */
  uint32_t hsize = kvt_ld32(s.buf + H_HDRSIZE);
  assert_true(hsize > HDR_FIXED + 2 * SEC_ENTRY);
  s.buf[hsize - 1] = 1;
  reseal(s.buf, s.len);
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len, NULL), KVT_ECORRUPT, "header padding",
            "header padding");
  sample_free(&s);
}

static void test_serde_parse_rejects_i4_group_that_does_not_divide_head_dim(void **state) {
  (void)state;
  sample s;
  sample_make(&s, "int4,kgroup=dim,group=16", KVT_DTYPE_BF16, 2, 4, 2, 32, 0);
  kvt_st16(s.buf + H_GROUP, 12);
  reseal(s.buf, s.len);
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len, NULL), KVT_ECORRUPT,
            "i4 group 12 does not fit head_dim 32 (offset 68)", "group 12");
  sample_free(&s);
}

/* ---- section table entries, each re-sealed ---- */

typedef struct entry_edit {
  const char *what;
  uint32_t entry;
  size_t off;
  int width;
  uint64_t value;
  uint32_t flags;     /* written to the header's flags */
  const char *detail; /* of the KVT_ECORRUPT every edit must give */
} entry_edit;

static const entry_edit entry_edits[] = {
    {"offset far outside", 3, S_OFFSET, 8, 1ull << 40, 0,
     "section 3 (offset 280): at 1099511627776+160"},
    {"offset at the end", 3, S_OFFSET, 8, 1184, 0, "section 3 (offset 280)"},
    {"offset 2^64-64", 3, S_OFFSET, 8, UINT64_MAX - 63, 0, "section 3 (offset 280)"},
    {"overlapping the previous section", 1, S_OFFSET, 8, 320, 0,
     "section 1 (offset 184): at 320+160, expected at 576"},
    {"inside the header", 0, S_OFFSET, 8, 0, 0, "section 0 (offset 136)"},
    {"unaligned", 2, S_OFFSET, 8, 736, 0, "section 2 (offset 232)"},
    {"stored size past its end", 0, S_STORED, 8, 256 + 64, 0,
     "section 0 (offset 144): stored size 320"},
    {"stored size 2^63", 3, S_STORED, 8, 1ull << 63, 0, "section 3 (offset 288)"},
    {"stored size 0", 1, S_STORED, 8, 0, 0, "section 1 (offset 192): stored size 0"},
    {"raw size off by two", 0, S_RAW, 8, 258, 0,
     "section 0 (offset 152): size 258, shape needs 256"},
    {"raw size 2^64-1", 1, S_RAW, 8, UINT64_MAX, 0, "section 1 (offset 200)"},
    {"layer 1 first", 0, S_LAYER, 4, 1, 0,
     "section 0 (offset 128) is layer 1 kind 0; expected 0 0"},
    {"two K sections", 1, S_KIND, 1, 0, 0, "section 1 (offset 176) is layer 0 kind 0"},
    {"kind 2", 3, S_KIND, 1, 2, 0, "section 3 (offset 272) is layer 1 kind 2"},
    {"reserved byte 7", 0, S_RSV0, 1, 1, 0, "section 0 (offset 128): reserved"},
    {"reserved byte 47", 3, S_RSV1 + 7, 1, 0x80, 0, "section 3 (offset 272): reserved"},
    {"format 9", 1, S_FMT, 1, 9, 0, "section 1 (offset 200): size 160, shape needs 0"},
    {"K stored as e4m3", 0, S_FMT, 1, KVT_FMT_E4M3, 0, "section 0 (offset 152)"},
    /* i8 and e4m3 sections have equal sizes: only the spec can tell. */
    {"V stored as i8", 1, S_FMT, 1, KVT_FMT_I8, 0,
     "sections 0-1 (layer 0): formats 0/2, spec says n16/e4m3"},
    {"compressed without the flag", 0, S_COMP, 1, KVT_COMP_ZSTD, 0,
     "section 0 (offset 128): compression 1"},
    {"compression 3", 0, S_COMP, 1, 3, KVT_FLAG_LOSSLESS, "section 0 (offset 128): compression 3"},
    {"compression 255", 2, S_COMP, 1, 255, KVT_FLAG_LOSSLESS, "compression 255"},
    {"byte shuffle of an e4m3 section", 1, S_COMP, 1, KVT_COMP_ZSTD_SHUFFLE16, KVT_FLAG_LOSSLESS,
     "section 1 (offset 176): compression 2"},
    {"compressed but no smaller", 0, S_COMP, 1, KVT_COMP_ZSTD, KVT_FLAG_LOSSLESS,
     "section 0 (offset 144): stored size 256"},
    {"flag without a compressed section", 0, S_RSV0, 1, 0, KVT_FLAG_LOSSLESS,
     "lossless flag set but no section is compressed"},
};

static void test_serde_parse_names_each_bad_section_entry(void **state) {
  (void)state;
  sample s;
  small(&s);
  size_t bad = 0;
  for (size_t i = 0; i < sizeof(entry_edits) / sizeof(entry_edits[0]); i++) {
    const entry_edit *f = &entry_edits[i];
    uint8_t *b = copy_of(&s);
    put(entry(b, f->entry) + f->off, f->width, f->value);
    if (f->flags)
      kvt_st32(b + H_FLAGS, f->flags);
    reseal(b, s.len);
    bad += !check_rc(kvt_payload_parse(ctx, b, s.len, NULL), KVT_ECORRUPT, f->detail, f->what);
    free(b);
  }
  sample_free(&s);
  if (bad)
    fail_msg("%zu of %zu section entry edits were not reported as expected", bad,
             sizeof(entry_edits) / sizeof(entry_edits[0]));
}

static void test_serde_parse_rejects_bytes_after_the_last_section(void **state) {
  (void)state;
  sample s;
  small(&s);
  memset(s.buf + s.len, 0, 64);
  kvt_st64(s.buf + H_SIZE, s.len + 64);
  reseal(s.buf, s.len + 64);
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len + 64, NULL), KVT_ECORRUPT,
            "sections end at 1184, payload at 1248", "64 bytes past the last section");
  sample_free(&s);
}

static void test_serde_parse_rejects_raw_layer_beyond_the_raw_bitmap(void **state) {
  (void)state;
  sample s;
  sample_make(&s, "k16v8,raw=0", KVT_DTYPE_BF16, 2, 4, 2, 16, 0);
  assert_int_equal(kvt_payload_parse(ctx, s.buf, s.len, NULL), 0);
  kvt_st32(s.buf + H_LBEGIN, 300);
  kvt_st32(s.buf + H_MLAYERS, 302);
  for (uint32_t i = 0; i < 4; i++)
    kvt_st32(entry(s.buf, i) + S_LAYER, 300 + i / 2);
  reseal(s.buf, s.len);
  expect_rc(kvt_payload_parse(ctx, s.buf, s.len, NULL), KVT_ECORRUPT,
            "layer 300 is raw but raw layers must be below 256", "raw layer 300");
  sample_free(&s);
}

static void test_serde_verify_rejects_nonzero_padding_that_parse_ignores(void **state) {
  (void)state;
  sample s;
  small(&s);
  s.buf[750] = 1; /* padding 736..767, covered by no checksum */
  assert_int_equal(kvt_payload_parse(ctx, s.buf, s.len, NULL), 0);
  expect_rc(kvt_payload_verify(ctx, s.buf, s.len, NULL), KVT_ECORRUPT,
            "padding before section 2 (offsets 736..768) is not zero", "padding byte 750");
  sample_free(&s);
}

static void test_serde_verify_and_decode_reject_section_checksum_mismatch(void **state) {
  (void)state;
  sample s;
  small(&s);
  uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
  assert_true(k && v);
  s.buf[1024 + 40] ^= 4; /* layer 1 V */
  assert_int_equal(kvt_payload_parse(ctx, s.buf, s.len, NULL), 0);
  expect_rc(kvt_payload_verify(ctx, s.buf, s.len, NULL), KVT_ECHECKSUM,
            "section 3 (layer 1 V) at offset 1024", "verify");
  expect_rc(decode_dense(&s, s.buf, s.len, k, v), KVT_ECHECKSUM, "section 3 (layer 1 V)", "decode");
  free(k);
  free(v);
  sample_free(&s);
}

/* Puts body in place of the last section's stored bytes as a compressed
 * section, with the payload size, flags and checksums made to agree. Returns
 * the new payload length. */
static size_t replace_last_section(uint8_t *b, const void *body, size_t n) {
  uint32_t last = kvt_ld32(b + H_NSEC) - 1;
  uint8_t *e = entry(b, last);
  uint64_t off = kvt_ld64(e + S_OFFSET);
  assert_true(n < kvt_ld64(e + S_RAW));
  memcpy(b + off, body, n);
  kvt_st64(e + S_STORED, n);
  e[S_COMP] = e[S_FMT] == KVT_FMT_N16 ? KVT_COMP_ZSTD_SHUFFLE16 : KVT_COMP_ZSTD;
  kvt_st32(b + H_FLAGS, KVT_FLAG_LOSSLESS);
  kvt_st64(b + H_SIZE, off + n);
  reseal_section(b, last);
  return off + n;
}

/* Crafted payloads whose zstd streams are wrong but whose checksums agree:
 * decoding must fail cleanly, never trust the stream's idea of its size. */
static void test_serde_decode_rejects_bad_zstd_stream_with_valid_checksums(void **state) {
  (void)state;
#ifndef KVT_HAVE_ZSTD
  skip();
#else
  sample s;
  sample_make(&s, "raw", KVT_DTYPE_BF16, 2, 16, 2, 64, 0);
  const size_t raw = 2 * (size_t)s.T * s.H * s.D;
  uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
  uint8_t *zeros = calloc(raw + 2, 1), *frame = malloc(ZSTD_compressBound(raw + 2));
  assert_true(k && v && zeros && frame);
  /* {frame content size, expected rc}: no frame at all, one 2 bytes short,
   * one 2 bytes long, and the control, exactly raw bytes of zeros. */
  const struct {
    long content;
    int want;
  } variants[] = {{-1, KVT_ECORRUPT},
                  {(long)raw - 2, KVT_ECORRUPT},
                  {(long)raw + 2, KVT_ECORRUPT},
                  {(long)raw, 0}};
  for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
    uint8_t *b = copy_of(&s);
    size_t n = 64;
    const uint8_t *body = zeros;
    if (variants[i].content >= 0) {
      n = ZSTD_compress(frame, ZSTD_compressBound(raw + 2), zeros, (size_t)variants[i].content, 3);
      assert_false(ZSTD_isError(n));
      body = frame;
    }
    size_t len = replace_last_section(b, body, n);
    assert_int_equal(kvt_payload_verify(ctx, b, len, NULL), 0);
    expect_rc(decode_dense(&s, b, len, k, v), variants[i].want,
              variants[i].want ? "zstd section does not decompress to 4096 bytes" : NULL,
              "crafted zstd section");
    if (variants[i].want == 0)
      assert_int_equal(v[elems(&s) - 1], 0);
    free(b);
  }
  free(zeros);
  free(frame);
  free(k);
  free(v);
  sample_free(&s);
#endif
}

/* Format 2's section checksum, computed here from its definition (FORMAT.md
 * section 3) with one-shot XXH3 calls: pieces of 4096 bytes, the last one
 * shorter, their little-endian digests hashed together. */
static uint64_t pieces_checksum(const uint8_t *b, size_t n) {
  uint8_t *d = malloc(8 * (n / 4096 + 1));
  assert_non_null(d);
  size_t k = 0;
  for (size_t at = 0; at < n || k == 0; at += 4096)
    kvt_st64(d + 8 * k++, kvt_hash64(b + at, n - at < 4096 ? n - at : 4096));
  uint64_t h = kvt_hash64(d, 8 * k);
  free(d);
  return h;
}

static void test_serde_section_checksum_hashes_4k_pieces(void **state) {
  (void)state;
  /* Sections of 1 (raw K: 70 x 4 x 64 x 2 = 35840 bytes = 8.75 pieces,
   * and an fp8 V of 1120 + 17920 bytes) to several pieces. */
  static const struct { const char *spec; uint32_t T, H, D; } cases[] = {
      {"raw", 70, 4, 64}, {"fp8", 70, 4, 64}, {"int4", 64, 4, 128}, {"raw", 16, 2, 64}};
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    sample s;
    sample_make(&s, cases[c].spec, KVT_DTYPE_BF16, 2, cases[c].T, cases[c].H, cases[c].D, 0);
    assert_int_equal(kvt_ld16(s.buf + H_VMAJOR), 2);
    for (uint32_t i = 0; i < 4; i++) {
      kvt_section_info si;
      assert_int_equal(kvt_payload_section(ctx, s.buf, s.len, i, &si), 0);
      if (si.checksum != pieces_checksum(s.buf + si.offset, si.stored_size))
        fail_msg("%s section %u (%" PRIu64 " bytes): checksum %016" PRIx64 " is not the 4 KiB "
                 "pieces' %016" PRIx64, cases[c].spec, i, si.stored_size, si.checksum,
                 pieces_checksum(s.buf + si.offset, si.stored_size));
    }
    sample_free(&s);
  }
}

/* kvt_hash64_blocks, the CPU's streaming form (digests batched 128 at a
 * time), against the definition at the batch's edges and the pieces'. */
static void test_serde_blockwise_hash_matches_its_definition_at_every_edge(void **state) {
  (void)state;
  static const size_t sizes[] = {1, 240, 241, 4095, 4096, 4097, 8192, 127 * 4096 + 1,
                                 128 * 4096 - 1, 128 * 4096, 128 * 4096 + 1, 129 * 4096 + 1,
                                 256 * 4096 + 5};
  const size_t max = 256 * 4096 + 5;
  uint8_t *b = malloc(max);
  assert_non_null(b);
  for (size_t i = 0; i < max; i++)
    b[i] = (uint8_t)(i * 2654435761u >> 13);
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    const uint64_t want = pieces_checksum(b, sizes[i]);
    if (kvt_hash64_blocks(b, sizes[i], 4096) != want ||
        kvt_section_checksum(2, b, sizes[i]) != want)
      fail_msg("%zu bytes: blockwise hash %016" PRIx64 ", definition %016" PRIx64, sizes[i],
               kvt_hash64_blocks(b, sizes[i], 4096), want);
    assert_int_equal(kvt_section_checksum(1, b, sizes[i]), kvt_hash64(b, sizes[i]));
  }
  /* A change in the first 512 KiB of a longer section changes the hash. */
  const uint64_t h = kvt_hash64_blocks(b, 129 * 4096 + 1, 4096);
  b[100] ^= 1;
  assert_true(kvt_hash64_blocks(b, 129 * 4096 + 1, 4096) != h);
  free(b);
}

/* The version selects the rule: a 2.0 payload relabelled 1.0 (header
 * resealed) fails its section checksums, and a 1.0 payload's whole-section
 * checksums verify. */
static void test_serde_version_selects_the_section_checksum(void **state) {
  (void)state;
  sample s;
  sample_make(&s, "raw", KVT_DTYPE_BF16, 1, 70, 4, 64, 0);
  uint8_t *b = copy_of(&s);
  kvt_st16(b + H_VMAJOR, 1);
  reseal(b, s.len);
  expect_rc(kvt_payload_verify(ctx, b, s.len, NULL), KVT_ECHECKSUM, "section 0", "2.0 as 1.0");
  for (uint32_t i = 0; i < 2; i++) {
    uint8_t *e = entry(b, i);
    kvt_st64(e + S_CHECKSUM, kvt_hash64(b + kvt_ld64(e + S_OFFSET), kvt_ld64(e + S_STORED)));
  }
  reseal(b, s.len);
  kvt_payload_info info;
  assert_int_equal(kvt_payload_verify(ctx, b, s.len, &info), 0);
  assert_int_equal(info.version_major, 1);
  uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
  assert_non_null(k);
  assert_non_null(v);
  assert_int_equal(decode_dense(&s, b, s.len, k, v), 0);
  assert_memory_equal(k, s.k, 2 * elems(&s)); /* raw: the source bits */
  free(k);
  free(v);
  free(b);
  sample_free(&s);
}

static void test_serde_payload_section_reports_the_table(void **state) {
  (void)state;
  sample s;
  small(&s);
  static const uint64_t off[4] = {320, 576, 768, 1024}, size[4] = {256, 160, 256, 160};
  for (uint32_t i = 0; i < 4; i++) {
    kvt_section_info si;
    assert_int_equal(kvt_payload_section(ctx, s.buf, s.len, i, &si), 0);
    assert_int_equal(si.layer, i / 2);
    assert_int_equal(si.is_value, i % 2);
    assert_int_equal(si.fmt, i % 2 ? KVT_FMT_E4M3 : KVT_FMT_N16);
    assert_int_equal(si.comp, KVT_COMP_NONE);
    assert_int_equal(si.offset, off[i]);
    assert_int_equal(si.stored_size, size[i]);
    assert_int_equal(si.raw_size, size[i]);
    /* one 4 KiB piece: XXH3-64 of its digest (FORMAT.md section 3) */
    uint8_t d[8];
    kvt_st64(d, kvt_hash64(s.buf + off[i], size[i]));
    assert_int_equal(si.checksum, kvt_hash64(d, 8));
  }
  kvt_section_info si;
  expect_rc(kvt_payload_section(ctx, s.buf, s.len, 4, &si), -EINVAL, "section 4 of 4", "i=4");
  expect_rc(kvt_payload_section(ctx, s.buf, s.len - 1, 0, &si), KVT_ETRUNC, NULL, "truncated");
  sample_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serde_parse_rejects_every_header_bit_flip),
      cmocka_unit_test(test_serde_verify_rejects_every_bit_flip),
      cmocka_unit_test(test_serde_decode_rejects_every_bit_flip_outside_padding),
      cmocka_unit_test(test_serde_rejects_every_truncation),
      cmocka_unit_test(test_serde_rejects_short_input_without_magic_as_format),
      cmocka_unit_test(test_serde_rejects_trailing_byte),
      cmocka_unit_test(test_serde_parse_names_each_bad_header_field),
      cmocka_unit_test(test_serde_parse_rejects_header_checksum_mismatch),
      cmocka_unit_test(test_serde_parse_accepts_reserved_bytes_of_a_newer_minor_version),
      cmocka_unit_test(test_serde_parse_minor_versions_and_header_padding),
      cmocka_unit_test(test_serde_parse_rejects_i4_group_that_does_not_divide_head_dim),
      cmocka_unit_test(test_serde_parse_names_each_bad_section_entry),
      cmocka_unit_test(test_serde_parse_rejects_bytes_after_the_last_section),
      cmocka_unit_test(test_serde_parse_rejects_raw_layer_beyond_the_raw_bitmap),
      cmocka_unit_test(test_serde_verify_rejects_nonzero_padding_that_parse_ignores),
      cmocka_unit_test(test_serde_verify_and_decode_reject_section_checksum_mismatch),
      cmocka_unit_test(test_serde_decode_rejects_bad_zstd_stream_with_valid_checksums),
      cmocka_unit_test(test_serde_payload_section_reports_the_table),
      cmocka_unit_test(test_serde_section_checksum_hashes_4k_pieces),
      cmocka_unit_test(test_serde_blockwise_hash_matches_its_definition_at_every_edge),
      cmocka_unit_test(test_serde_version_selects_the_section_checksum),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
