/* serde/payload_layout.h - the payload's header and section table as fields
 * (FORMAT.md sections 1 and 2), for code that writes or reads them outside
 * serde: the GPU store and load (gpu/gpu_store.c, gpu/gpu_load.c). Their
 * byte offsets stay in serde (serde_internal.h); serde's own writer and
 * parser use these helpers too. Internal: not installed. No helper checks anything; the parser does.
 * Device code (nvcc) sees only the constants. */
#ifndef KVT_PAYLOAD_LAYOUT_H
#define KVT_PAYLOAD_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define HDR_FIXED 128 /* bytes of the fixed header, before the section table */
#define SEC_ENTRY 48  /* bytes of a section table entry */
#define SEC_ALIGN 64  /* alignment of the header's end and of every section */

/* Where the checksums are, for code that seals or verifies a payload where
 * it lies and cannot call the helpers below (the GPU checksum kernels,
 * gpu/gpu_checksum.cu): the header's checksum field, and within a section
 * table entry its offset, stored size and checksum fields. serde_internal.h's
 * H_CHECKSUM, S_OFFSET, S_STORED and S_CHECKSUM are these. */
#define KVT_PL_HEADER_CHECKSUM 120
#define KVT_PL_ENTRY_OFFSET 8
#define KVT_PL_ENTRY_STORED 16
#define KVT_PL_ENTRY_CHECKSUM 32

/* Format 2's section checksum (FORMAT.md section 3): XXH3-64 over the
 * XXH3-64 digests of the section's consecutive pieces of this many bytes. */
#define KVT_PL_CHECKSUM_BLOCK 4096

#ifndef __CUDACC__

#include "kvt_internal.h"
#include "kvtier/payload.h"

/* Bytes of a header with a table of `sections` entries, zero padding included. */
static inline uint64_t kvt_header_size(uint32_t sections) {
  return kvt_align_up(HDR_FIXED + (uint64_t)SEC_ENTRY * sections, SEC_ALIGN);
}

/* Writes the fixed header of the payload *h describes at dst, the format
 * version this library writes (h's version fields are not used) and a zero
 * checksum, and zeroes the padding between the table of h->sections
 * entries and h->header_size. The section table is left as it is. The one
 * writer of a payload header: serde's and the GPU's payloads both come
 * through here. */
void kvt_header_put(uint8_t *dst, const kvt_payload_info *h);

/* Stores the header checksum of the header at dst, over the header_size
 * bytes its own field says (the table must be complete). */
void kvt_header_seal(uint8_t *dst);

/* The fixed header's fields at b (HDR_FIXED bytes), unchecked, into *h;
 * h->spec.raw_layers is zero (the section table says which layers are raw). */
void kvt_header_get(const uint8_t *b, kvt_payload_info *h);

/* The checksum field of the header at b, as stored. */
uint64_t kvt_header_stored_checksum(const uint8_t *b);

/* XXH3-64 of the header_size bytes at hdr with the checksum field taken as
 * zero: what kvt_header_seal stores and the parser compares. */
uint64_t kvt_header_checksum(const uint8_t *hdr, size_t header_size);

/* Writes entry i of the section table of the header at hdr from *s
 * (reserved bytes zero). */
void kvt_section_entry_put(uint8_t *hdr, uint32_t i, const kvt_section_info *s);

/* Reads entry i of the section table of the header at hdr, unchecked. */
void kvt_section_entry_get(const uint8_t *hdr, uint32_t i, kvt_section_info *s);

/* Sets only the checksum field of entry i (sealing a payload in place). */
void kvt_section_entry_set_checksum(uint8_t *hdr, uint32_t i, uint64_t checksum);

/* The checksum of a section's len stored bytes under format version `major`
 * (the payload's version_major): XXH3-64 of the bytes in format 1, the
 * blockwise hash (KVT_PL_CHECKSUM_BLOCK) in format 2. */
uint64_t kvt_section_checksum(unsigned major, const uint8_t *data, size_t len);

#endif /* __CUDACC__ */
#endif
