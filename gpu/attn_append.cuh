/* gpu/attn_append.cuh - the cache writer of decode attention
 * (kvt_attn_append): a decode step's new K/V quantized into the cache with
 * the codec's arithmetic (codec_device.cuh, the store kernels' own).
 * Included by attn_kernels.cu after its shared helpers (conversions,
 * formats), inside namespace kvt_attn_dev. Not a header of its own: one
 * translation unit, split by responsibility. */
#ifndef KVT_ATTN_APPEND_CUH
#define KVT_ATTN_APPEND_CUH

/* One warp per (token, kv head), E = D/32 elements per lane. */
template <int DT, int E>
__device__ void append_row(const kvt_attn_aparams &p, int kind, int fmt,
                           uint64_t slot, uint32_t tok, uint32_t h, int lane) {
  const uint32_t D = p.head_dim, H = p.kv_heads;
  const uint16_t *src =
      reinterpret_cast<const uint16_t *>(kind ? p.v_src : p.k_src) +
      ((uint64_t)tok * H + h) * D + (uint32_t)lane * E;
  float x[E];
  uint16_t raw[E];
#pragma unroll
  for (int i = 0; i < E; i++) {
    raw[i] = src[i];
    x[i] = h16_to_f<DT>(raw[i]);
  }
  const uint64_t page = slot / p.block_size, off = slot % p.block_size;
  const uint64_t row = slot * H + h; /* codes row index */
  const uint64_t sidx = (page * H + h) * p.block_size + off; /* scale index */
  uint8_t *codes = reinterpret_cast<uint8_t *>(kind ? p.v : p.k);
  void *scales = reinterpret_cast<void *>(kind ? p.v_scale : p.k_scale);
  if (fmt == KVT_FMT_N16) {
    uint16_t *dst =
        reinterpret_cast<uint16_t *>(codes) + row * D + (uint32_t)lane * E;
#pragma unroll
    for (int i = 0; i < E; i++)
      dst[i] = raw[i];
  } else if (fmt == KVT_FMT_E4M3) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < E; i++)
      amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
    for (int s = 16; s > 0; s >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    float scale, inv;
    scale_for(amax, 448.0f, &scale, &inv);
    uint8_t *dst = codes + row * D + (uint32_t)lane * E;
#pragma unroll
    for (int i = 0; i < E; i++)
      dst[i] = q_e4m3(x[i], inv);
    if (lane == 0)
      reinterpret_cast<float *>(scales)[sidx] = scale;
  } else { /* i4 along dim, groups of 32 = 32/E lanes */
    float mn = x[0], mx = x[0];
#pragma unroll
    for (int i = 1; i < E; i++) {
      mn = fminf(mn, x[i]);
      mx = fmaxf(mx, x[i]);
    }
#pragma unroll
    for (int s = 16 / E; s > 0; s >>= 1) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, s));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
    }
    uint32_t packed;
    float zero, inv;
    i4_params<false>(mn, mx, &packed, &zero, &inv); /* unchecked: see there */
    uint8_t *dst = codes + row * (D / 2) + (uint32_t)lane * (E / 2);
#pragma unroll
    for (int i = 0; i < E; i += 2)
      dst[i / 2] =
          (uint8_t)(q_i4(x[i], zero, inv) | (q_i4(x[i + 1], zero, inv) << 4));
    if (lane % (32 / E) == 0)
      reinterpret_cast<uint32_t *>(
          scales)[sidx * (D / 32) + (uint32_t)lane / (32 / E)] = packed;
  }
}

template <int DT, int E>
__global__ void append_kernel(const kvt_attn_aparams p) {
  const uint32_t tok = blockIdx.x;
  const uint32_t h = blockIdx.y * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (h >= p.kv_heads)
    return;
  const int64_t slot = reinterpret_cast<const int64_t *>(p.slots)[tok];
  if (slot < 0 || (uint64_t)slot >= p.slot_limit)
    return;
  const int fk = p.format == KVT_ATTN_FP8    ? KVT_FMT_E4M3
                 : p.format == KVT_ATTN_INT4 ? KVT_FMT_I4
                                             : KVT_FMT_N16;
  const int fv = p.format == KVT_ATTN_RAW    ? KVT_FMT_N16
                 : p.format == KVT_ATTN_INT4 ? KVT_FMT_I4
                                             : KVT_FMT_E4M3;
  append_row<DT, E>(p, 0, fk, (uint64_t)slot, tok, h, lane);
  append_row<DT, E>(p, 1, fv, (uint64_t)slot, tok, h, lane);
}

template <int DT>
int launch_append(const kvt_attn_aparams *p, cudaStream_t st) {
  const dim3 grid(p->batch, (p->kv_heads + 3) / 4);
  switch (p->head_dim) {
  case 64:
    append_kernel<DT, 2><<<grid, 128, 0, st>>>(*p);
    break;
  case 128:
    append_kernel<DT, 4><<<grid, 128, 0, st>>>(*p);
    break;
  default:
    append_kernel<DT, 8><<<grid, 128, 0, st>>>(*p);
    break;
  }
  return (int)cudaGetLastError();
}

#endif
