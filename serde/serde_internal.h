/* serde/serde_internal.h - byte offsets of the payload format (FORMAT.md),
 * private to serde/, and the helpers the writer and reader share. Code
 * outside serde/ reads and writes the header through payload_layout.h. */
#ifndef KVT_SERDE_INTERNAL_H
#define KVT_SERDE_INTERNAL_H

#include "codec_internal.h"
#include "kvt_internal.h"
#include "kvtier/payload.h"
#include "payload_layout.h"

#define KVT_MAGIC "\x89KVT\r\n\x1a\n"
#define KVT_FORMAT_MINOR 0

/* Fixed header offsets. */
enum {
  H_MAGIC = 0,
  H_VMAJOR = 8,
  H_VMINOR = 10,
  H_HDRSIZE = 12,
  H_SIZE = 16,
  H_FLAGS = 24,
  H_NSEC = 28,
  H_KEY = 32,
  H_FPRINT = 48,
  H_KFMT = 64,
  H_VFMT = 65,
  H_SCALE = 66,
  H_KAXIS = 67,
  H_GROUP = 68,
  H_BLOCK = 70,
  H_DTYPE = 72,
  H_RSV0 = 73, /* 3 bytes */
  H_MLAYERS = 76,
  H_LBEGIN = 80,
  H_LCOUNT = 84,
  H_TOKENS = 88,
  H_HEADS = 92,
  H_HDIM = 96,
  H_TBEGIN = 100,
  H_RSV1 = 104, /* 16 bytes */
  H_CHECKSUM = KVT_PL_HEADER_CHECKSUM
};

/* Section table entry offsets. */
enum {
  S_LAYER = 0,
  S_KIND = 4,
  S_FMT = 5,
  S_COMP = 6,
  S_RSV0 = 7,
  S_OFFSET = KVT_PL_ENTRY_OFFSET,
  S_STORED = KVT_PL_ENTRY_STORED,
  S_RAW = 24,
  S_CHECKSUM = KVT_PL_ENTRY_CHECKSUM,
  S_RSV1 = 40
};

#define KVT_FLAG_LOSSLESS KVT_PAYLOAD_FLAG_LOSSLESS

/* Lossless stage (serde/lossless.c). Scratch buffers live on the context. */
typedef struct kvt_serde_scratch kvt_serde_scratch;
/* A buffer of at least n bytes from the context's cache (slot 0 or 1). */
int kvt_scratch_get(kvt_ctx *ctx, int slot, size_t n, uint8_t **out);
/* Compresses raw into dst (cap bytes). *out_len = 0 when it did not pay. */
int kvt_lossless_compress(kvt_ctx *ctx, int level, int shuffle16, const uint8_t *raw,
                          size_t n, uint8_t *dst, size_t cap, size_t *out_len);
/* Undoes the stage into a scratch buffer; *out points at raw_size bytes. */
int kvt_lossless_decompress(kvt_ctx *ctx, int comp, const uint8_t *src, size_t n,
                            size_t raw_size, const uint8_t **out);

#endif
