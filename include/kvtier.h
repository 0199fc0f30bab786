/* kvtier.h - the whole public API of kvtier.
 *
 *   kvtier/core.h     context, allocator hooks, logging, errors, versions
 *   kvtier/codec.h    K/V formats, codec specs, strided KV views
 *   kvtier/key.h      model fingerprints and chained chunk keys
 *   kvtier/payload.h  encode, validate and decode payloads
 *   kvtier/tier.h     storage tiers (DRAM, HBM, NVMe, Redis, fabric), completion-based
 *   kvtier/cache.h    the cache: placement across tiers, eviction, prefix lookup
 *   kvtier/model.h    the bandwidth model: KV bytes, link shortfall, advice
 *   kvtier/gpu.h      fused GPU store/load between engine paged caches and payloads
 *                     (experimental: docs/API.md)
 *   kvtier/attn.h     decode attention over compressed paged caches (experimental)
 *   kvtier/server.h   the cache server's engine and its counters (experimental)
 *
 * Compiles as C (C99 or later) and C++; includes no CUDA header. */
#ifndef KVTIER_H
#define KVTIER_H

#include "kvtier/core.h"
#include "kvtier/codec.h"
#include "kvtier/key.h"
#include "kvtier/payload.h"
#include "kvtier/tier.h"
#include "kvtier/cache.h"
#include "kvtier/model.h"
#include "kvtier/gpu.h"
#include "kvtier/attn.h"
#include "kvtier/server.h"

#endif
