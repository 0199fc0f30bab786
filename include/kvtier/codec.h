/* kvtier/codec.h - K/V formats, codec specs and the strided KV view.
 *
 * A codec spec names the key format and the value format independently
 * (keys and values do not tolerate the same precision), their scale or group
 * granularity, and layers kept raw. Specs are written as text, either a
 * preset or the general form:
 *
 *   raw | k16v8 | fp8 | int8 | k16v4 | k8v4 | int4
 *   k=FMT,v=FMT[,group=N][,scale=token|block|layer][,block=N]
 *              [,kgroup=dim|token][,raw=LAYERS]
 *
 * where FMT is n16, e4m3, i8 or i4; a preset may be followed by options too
 * ("k16v8,raw=0,31" keeps layers 0 and 31 raw; "int4,kgroup=dim"). LAYERS is
 * a list of layer indices and ranges, "0,1,30-31". See README.md for the
 * table of presets and their measured errors. */
#ifndef KVTIER_CODEC_H
#define KVTIER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Source element type of the engine's KV cache. */
enum kvt_dtype { KVT_DTYPE_BF16 = 1, KVT_DTYPE_F16 = 2 };

/* Element formats. Values are stored in payloads: never renumbered. */
enum kvt_fmt {
  KVT_FMT_N16 = 0,  /* the source 16-bit patterns, bit-exact */
  KVT_FMT_E4M3 = 1, /* OCP FP8 E4M3 with an fp32 scale (amax/448) */
  KVT_FMT_I8 = 2,   /* symmetric int8 with an fp32 scale (amax/127) */
  KVT_FMT_I4 = 3    /* 4-bit, fp16 scale and zero per group */
};

/* Granularity of the fp32 scales of e4m3 and i8 sections. */
enum kvt_scale {
  KVT_SCALE_TOKEN = 0, /* one per (layer, token, head): the default */
  KVT_SCALE_BLOCK = 1, /* one per (layer, block of `block` tokens, head) */
  KVT_SCALE_LAYER = 2  /* one per layer */
};

/* Axis along which i4 key groups run. Values always group along head dim. */
enum kvt_axis {
  KVT_AXIS_DIM = 0,  /* `group` consecutive elements of one head vector */
  KVT_AXIS_TOKEN = 1 /* one channel over `group` consecutive tokens (KIVI) */
};

#define KVT_MAX_LAYERS 4096       /* layers in one model */
#define KVT_MAX_RAW_LAYER 256     /* raw= overrides address layers < this */
#define KVT_CODEC_SPEC_TEXT_MAX 1024 /* longest spec text, NUL included */

typedef struct kvt_codec_spec {
  uint8_t k_fmt;    /* enum kvt_fmt */
  uint8_t v_fmt;    /* enum kvt_fmt */
  uint8_t scale;    /* enum kvt_scale */
  uint8_t k_axis;   /* enum kvt_axis, for i4 keys */
  uint16_t group;   /* i4 group size; even, divides head_dim when along dim */
  uint16_t block;   /* tokens per scale block for KVT_SCALE_BLOCK */
  uint64_t raw_layers[KVT_MAX_RAW_LAYER / 64]; /* bit l: layer l stays n16 */
  /* Zero (kvt_codec_validate refuses anything else, KVT_ESPEC): room for
   * later options, whose zero will mean what 0.3 does. A fixed-size value
   * type, so it may be embedded in other structs (docs/API.md). */
  uint64_t reserved[2];
} kvt_codec_spec;

/* A raw spec with every option at its default (group 32, block 16, scale per
 * token, i4 keys grouped along tokens). */
#define KVT_CODEC_SPEC_INIT {0, 0, 0, 1, 32, 16, {0, 0, 0, 0}, {0, 0}}

/* Parses spec text into *out (written only on success; reserved fields
 * zeroed). Returns 0 or
 * KVT_ESPEC with the offending word in kvt_ctx_last_error(ctx); ctx may be
 * NULL. */
KVT_API int kvt_codec_parse(kvt_ctx *ctx, const char *text, kvt_codec_spec *out);

/* Writes the canonical text of spec (parsable by kvt_codec_parse, and the
 * same for equal specs: a preset name where one fits, else k=FMT,v=FMT, then
 * the options that differ from their defaults) into buf. Returns 0, KVT_ESPEC for an invalid spec,
 * or KVT_ENOBUFS when cap is too small (KVT_CODEC_SPEC_TEXT_MAX always
 * suffices). */
KVT_API int kvt_codec_format(const kvt_codec_spec *spec, char *buf, size_t cap);

/* Checks a spec's fields (reserved ones must be zero). Returns 0 or
 * KVT_ESPEC (detail in ctx, may be NULL). */
KVT_API int kvt_codec_validate(kvt_ctx *ctx, const kvt_codec_spec *spec);

/* The format actually used for keys (is_value = 0) or values (1) of an
 * absolute layer, after raw= overrides. */
KVT_API int kvt_codec_layer_fmt(const kvt_codec_spec *spec, uint32_t layer, int is_value);

/* Lower-case name of a format ("e4m3") or dtype ("bf16"); "?" if unknown. */
KVT_API const char *kvt_fmt_name(int fmt);
KVT_API const char *kvt_dtype_name(int dtype);

/* A strided view of K and V laid out [layer][token][head][dim], pointing into
 * the caller's memory (an engine's cache, a file, a scratch buffer). Strides
 * are in elements; the head_dim elements of one (layer, token, head) must be
 * contiguous. Strides may be any value, including ones that interleave K and
 * V or skip over other data. For encode k/v are read; for decode written. */
typedef struct kvt_kv_view {
  size_t struct_size; /* sizeof(kvt_kv_view): KVT_KV_VIEW_INIT or kvt_kv_view_dense */
  void *k;
  void *v;
  int64_t k_stride[3]; /* layer, token, head */
  int64_t v_stride[3];
  uint32_t layers, tokens, heads, head_dim;
  int dtype; /* enum kvt_dtype */
} kvt_kv_view;

#define KVT_KV_VIEW_INIT \
  { sizeof(kvt_kv_view), NULL, NULL, {0, 0, 0}, {0, 0, 0}, 0, 0, 0, 0, KVT_DTYPE_BF16 }

/* Fills every field of *view (struct_size included) for dense
 * [layer][token][head][dim] arrays k and v. */
KVT_API void kvt_kv_view_dense(kvt_kv_view *view, void *k, void *v, int dtype,
                               uint32_t layers, uint32_t tokens, uint32_t heads,
                               uint32_t head_dim);

/* 16-bit conversions used by the codecs, exposed so engines and tests agree
 * on rounding: round-to-nearest-even, NaN kept. */
KVT_API float kvt_bf16_to_f32(uint16_t h);
KVT_API uint16_t kvt_f32_to_bf16(float f);
KVT_API float kvt_f16_to_f32(uint16_t h);
KVT_API uint16_t kvt_f32_to_f16(float f);

/* OCP FP8 E4M3 (bias 7, max 448, no infinities, subnormals kept). Encoding
 * rounds to nearest even and saturates finite overflow and infinities to
 * +-448; NaN gives 0x7F whatever its sign, the same bytes as CUDA's
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3). */
KVT_API uint8_t kvt_f32_to_e4m3(float f);
KVT_API float kvt_e4m3_to_f32(uint8_t b);

#ifdef __cplusplus
}
#endif
#endif
