/* kvtier/payload.h - encode K/V into a payload, validate it, decode it back.
 *
 * A payload is one self-describing, checksummed byte string holding one chunk
 * (a layer range of K and V for `tokens` tokens). The same bytes go to every
 * tier and over the wire; the byte format is specified in serde/FORMAT.md.
 *
 * Every payload is treated as hostile: kvt_payload_parse() checks each length
 * and offset and the header checksum before it uses a field, and the decoders
 * check each section's checksum before they read a byte of it. A bad payload
 * is a precise error (KVT_EFORMAT, KVT_EVERSION, KVT_ETRUNC, KVT_ECORRUPT,
 * KVT_ECHECKSUM, KVT_ETOOBIG, KVT_EFOREIGN) with the field and offset in
 * kvt_ctx_last_error(), never a crash and never an out-of-bounds read.
 *
 * Memory: encode and decode without the lossless stage do not allocate. The
 * lossless stage (zstd) uses buffers cached on the context, allocated on
 * first use through its allocator and reused after. */
#ifndef KVTIER_PAYLOAD_H
#define KVTIER_PAYLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/codec.h"
#include "kvtier/key.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Payloads larger than this are refused by the writer and the parser. */
#define KVT_PAYLOAD_MAX ((uint64_t)1 << 32)
#define KVT_MAX_TOKENS (1u << 20)
#define KVT_MAX_HEADS 1024u
#define KVT_MAX_HEAD_DIM 1024u

/* Section compression, stored per section. */
enum kvt_comp {
  KVT_COMP_NONE = 0,
  KVT_COMP_ZSTD = 1,          /* zstd of the section bytes */
  KVT_COMP_ZSTD_SHUFFLE16 = 2 /* zstd of the section's 16-bit words split
                                 into a low-byte plane and a high-byte plane */
};

typedef struct kvt_encode_params {
  size_t struct_size;   /* sizeof(kvt_encode_params) */
  kvt_codec_spec spec;  /* how to encode; see kvtier/codec.h */
  kvt_key key;          /* the chunk key (kvt_chunk_key) */
  kvt_key fingerprint;  /* the model fingerprint (kvt_fingerprint) */
  uint32_t model_layers;/* all layers of the model; 0: the view's layer count */
  uint32_t layer_begin; /* absolute index of the view's layer 0 */
  uint32_t token_begin; /* position of the chunk's first token in its sequence */
  int zstd_level;       /* 0: no lossless stage; 1..19: zstd level, used per
                           section only where it saves at least 3% */
} kvt_encode_params;

#define KVT_ENCODE_PARAMS_INIT \
  { sizeof(kvt_encode_params), KVT_CODEC_SPEC_INIT, {{0}}, {{0}}, 0, 0, 0, 0 }

/* Bytes kvt_encode() may write for this spec and a view of `layers` layers
 * starting at absolute layer layer_begin (raw= overrides name absolute
 * layers): exact without the lossless stage, an upper bound with it. Returns
 * 0, KVT_ESPEC, KVT_ESHAPE or KVT_ETOOBIG, with detail in ctx (may be NULL). */
KVT_API int kvt_encode_bound(kvt_ctx *ctx, const kvt_codec_spec *spec, uint32_t layer_begin,
                             uint32_t layers, uint32_t tokens, uint32_t heads,
                             uint32_t head_dim, uint64_t *out);

/* Header flag bits (kvt_payload_info.flags). */
#define KVT_PAYLOAD_FLAG_LOSSLESS 1u /* some section uses the lossless stage */

/* Encodes src into dst[0..cap) and writes the payload's length to *len.
 * ctx must not be NULL. Fields the spec's formats do not use are written with
 * their defaults. Returns 0; -EINVAL (NULL ctx, params, dst or len; a
 * struct_size of params or src too small; zstd level outside 0..19);
 * KVT_ESPEC; KVT_ESHAPE (view does not fit the spec); KVT_ETOOBIG (tokens, heads, head_dim or payload size over the limits above);
 * KVT_ENONFINITE naming layer, token and head of the first NaN/Inf in a
 * tensor to be quantized; KVT_ERANGE for an i4 group whose range does not fit
 * fp16 scales; KVT_ENOBUFS; KVT_ENOTSUP (zstd asked for, not built in);
 * -ENOMEM (lossless stage). On failure dst's contents are unspecified. */
KVT_API int kvt_encode(kvt_ctx *ctx, const kvt_encode_params *params,
                       const kvt_kv_view *src, void *dst, size_t cap,
                       size_t *len);

/* What a payload's header says. An output struct of fixed size: the library
 * writes every byte of it, the reserved tail as zeros (docs/API.md). */
typedef struct kvt_payload_info {
  uint16_t version_major, version_minor;
  uint32_t flags;
  uint64_t size;          /* whole payload, bytes */
  uint32_t header_size;
  uint32_t sections;
  kvt_key key, fingerprint;
  kvt_codec_spec spec;
  int dtype;
  uint32_t model_layers, layer_begin, layers, tokens, heads, head_dim;
  uint32_t token_begin;
  uint64_t reserved[4]; /* zeroed by the library: later header fields */
} kvt_payload_info;

/* One entry of a payload's section table; output, fixed size as above. */
typedef struct kvt_section_info {
  uint32_t layer;      /* absolute layer */
  int is_value;        /* 0: K, 1: V */
  int fmt;             /* enum kvt_fmt */
  int comp;            /* enum kvt_comp */
  uint64_t offset;     /* from the payload's first byte; 64-byte aligned */
  uint64_t stored_size;/* bytes at offset */
  uint64_t raw_size;   /* bytes after the lossless stage is undone */
  uint64_t checksum;   /* the section checksum (serde/FORMAT.md section 3) */
  uint64_t reserved[2];/* zeroed by the library: later entry fields */
} kvt_section_info;

/* Validates the header and section table of buf[0..len) (magic, version,
 * header checksum, every field, offset and length) and fills *info (may be
 * NULL). Section bodies are not read: see kvt_payload_verify(). */
KVT_API int kvt_payload_parse(kvt_ctx *ctx, const void *buf, size_t len,
                              kvt_payload_info *info);

/* kvt_payload_parse() plus every section's checksum and the zero padding
 * between sections: a full integrity check. */
KVT_API int kvt_payload_verify(kvt_ctx *ctx, const void *buf, size_t len,
                               kvt_payload_info *info);

/* Entry i of a payload that kvt_payload_parse() accepted. Returns 0 or
 * -EINVAL for i out of range (the payload is parsed again; no state kept). */
KVT_API int kvt_payload_section(kvt_ctx *ctx, const void *buf, size_t len,
                                uint32_t i, kvt_section_info *out);

typedef struct kvt_decode_params {
  size_t struct_size;           /* sizeof(kvt_decode_params) */
  const kvt_key *expect_key;    /* NULL, or the key the payload must carry */
  const kvt_key *expect_fingerprint; /* NULL, or the model it must belong to */
  uint32_t layer_first;         /* first layer to decode, relative to the
                                   payload's layer_begin */
  uint32_t layer_count;         /* 0: every layer from layer_first on */
} kvt_decode_params;

#define KVT_DECODE_PARAMS_INIT { sizeof(kvt_decode_params), NULL, NULL, 0, 0 }

/* Validates buf and decodes the chosen layers into dst (ctx must not be
 * NULL), whose tokens, heads, head_dim and dtype must match the payload and
 * whose layer count must equal the layers decoded (a dst or params
 * struct_size too small: -EINVAL). params may be NULL (all layers, no
 * expectations).
 * Section checksums are verified before each section is read; on a checksum
 * failure nothing from that section is written (earlier sections may be). A
 * foreign payload (expectation not met) is KVT_EFOREIGN. */
KVT_API int kvt_decode(kvt_ctx *ctx, const void *buf, size_t len,
                       const kvt_decode_params *params, const kvt_kv_view *dst);

#ifdef __cplusplus
}
#endif
#endif
