/* kvtier/model.h - the bandwidth model: what a model's KV cache costs to
 * read, hold and move, per codec, and which tier or link can feed it.
 *
 * Decode reads the whole KV cache of every sequence in the batch at every
 * step. For a model of L layers, H KV heads, head dims dk (K) and dv (V):
 *
 *   bytes per token   = sum over layers of H * (bytes of dk K elements +
 *                       bytes of dv V elements), as the codec stores them
 *                       (scales and zero points included)
 *   bytes per step    = B * (full-context bytes per token * T
 *                            + sliding-window bytes per token * min(T, W))
 *   required bandwidth = bytes per step / (tau * k)
 *   shortfall          = required bandwidth / link bandwidth
 *
 * with B sequences, context T, target inter-token latency tau and k tokens
 * accepted per speculative verification (1 without speculation). Bytes per
 * element are never tabulated here: kvt_model_kv_rate_get() asks the codec
 * (kvt_encode_bound(), kvtier/payload.h) what a chunk of each layer encodes
 * to, so this model and the payloads the library writes cannot disagree.
 * The cache uses these same functions to say whether restoring a cached
 * prefix beats recomputing it (kvt_cache_plan_restore in kvtier/cache.h).
 *
 * Units: bytes, seconds and bytes per second unless a name says otherwise
 * (GB = 1e9 bytes). Everything here is pure computation on the caller's
 * structs: thread-safe, no allocation, no I/O. Functions that can fail
 * return 0 or a KVT_E* code (kvtier/error.h) with detail in ctx (which may
 * be NULL). */
#ifndef KVTIER_MODEL_H
#define KVTIER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_ARCH_MAX_LAYERS 1024 /* layers of one model in this model */
#define KVT_ARCH_NAME_MAX 48     /* name bytes, NUL included */

/* What the bandwidth model needs to know of a model. Multi-head latent
 * attention (DeepSeek-V2/V3) caches one latent per token per layer, shared
 * by K and V: describe it as kv_heads = 1, k_dim = the RoPE part (64) and
 * v_dim = the latent (512). The codec's key format then applies to the RoPE
 * part and its value format to the latent, which is how DeepSeek's own FP8
 * MLA cache splits them (RoPE part kept 16-bit). */
typedef struct kvt_model_arch {
  size_t struct_size;            /* sizeof(kvt_model_arch) */
  char name[KVT_ARCH_NAME_MAX];  /* "llama-3.1-8b"; for display only */
  uint32_t layers;               /* 1..KVT_ARCH_MAX_LAYERS */
  uint32_t kv_heads;             /* KV heads cached per layer (MLA: 1) */
  uint32_t k_dim;                /* K elements per head per token */
  uint32_t v_dim;                /* V elements per head per token; 0: k_dim */
  uint32_t window;               /* tokens a sliding-window layer reads; 0: none */
  uint64_t window_layers[KVT_ARCH_MAX_LAYERS / 64]; /* bit l: layer l is windowed */
  uint32_t q_heads;              /* query heads (prefill FLOP model); 0: kv_heads */
  uint32_t qk_dim;               /* per query head, q.k dims; 0: k_dim */
  uint32_t pv_dim;               /* per query head, p.v dims; 0: v_dim */
  uint32_t max_context;          /* longest context trained for; 0: unknown */
  uint32_t weight_bits;          /* bits per weight as served; 0: 16 */
  uint32_t mla;                  /* 1: K and V are one latent (display only) */
  double params;                 /* all parameters */
  double active_params;          /* parameters used per token (MoE); 0: params */
} kvt_model_arch;

#define KVT_MODEL_ARCH_INIT                                                          \
  {                                                                                  \
    sizeof(kvt_model_arch), {0}, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 0, 0, 0, 0.0, 0.0 \
  }

/* Fills *out with the preset called name (case-insensitive: "llama-3.1-8b",
 * "llama-3.1-70b", "mistral-7b", "mistral-small-24b", "qwen2.5-0.5b",
 * "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "phi-4",
 * "gemma3-12b", "deepseek-v3", and a few aliases). Shapes are those of the
 * models' published config.json files. Returns 0 or KVT_ENOTFOUND. */
KVT_API int kvt_model_preset(const char *name, kvt_model_arch *out);

/* Preset i (0, 1, ... in a fixed order) into *out; KVT_ENOTFOUND past the
 * last, so `for (i = 0; kvt_model_preset_at(i, &m) == 0; i++)` lists them. */
KVT_API int kvt_model_preset_at(size_t i, kvt_model_arch *out);

/* Reads a Hugging Face config.json (text[0..len), need not be
 * NUL-terminated) into *out, named name (may be NULL: the file's
 * "_name_or_path" or "model_type"). Understands num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim (else hidden_size /
 * heads), sliding_window with layer_types, sliding_window_pattern or
 * max_window_layers, MLA (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
 * v_head_dim), a nested text_config (multimodal models), and estimates the
 * parameter count from the shapes (dense and MoE: experts, shared experts,
 * experts per token). The reader is strict JSON, depth-limited (64) and
 * never reads past len. out->struct_size must be set (KVT_MODEL_ARCH_INIT);
 * *out is written only on success. Returns 0; -EINVAL (struct_size);
 * KVT_ECORRUPT for text that is not JSON (offset in ctx); KVT_ETOOBIG for
 * nesting deeper than 64; KVT_ENOTFOUND for a missing required field;
 * KVT_ERANGE or KVT_ESHAPE for values out of range or inconsistent. */
KVT_API int kvt_model_from_hf_config(kvt_ctx *ctx, const char *text, size_t len,
                                     const char *name, kvt_model_arch *out);

/* Checks a model's fields (non-zero sizes, limits of kvtier/payload.h,
 * windowed layers only with a window). Returns 0 or KVT_ESHAPE. */
KVT_API int kvt_model_validate(kvt_ctx *ctx, const kvt_model_arch *m);

/* Weight bytes one decode step reads: active parameters x weight bits / 8
 * (for MoE a lower bound: a batch touches more experts than one token). */
KVT_API double kvt_model_weight_bytes(const kvt_model_arch *m);

/* --- bytes per token, from the codec ------------------------------------ */

/* KV bytes per token of context, split by the layers' reach. */
typedef struct kvt_model_kv_rate {
  size_t struct_size;   /* sizeof(kvt_model_kv_rate) */
  double full_bytes;    /* per token, summed over layers that read all of it */
  double window_bytes;  /* per token, summed over sliding-window layers */
  uint32_t window;      /* tokens those layers read at most */
  uint32_t chunk_tokens;/* tokens per chunk the codec was asked about */
  double elements;      /* K and V elements per token over all layers */
} kvt_model_kv_rate;

#define KVT_MODEL_KV_RATE_INIT \
  { sizeof(kvt_model_kv_rate), 0.0, 0.0, 0, 0, 0.0 }

/* Bytes per token of model m under codec spec, from kvt_encode_bound():
 * the bytes a payload grows by per token, per layer (raw= overrides
 * honoured), excluding the per-payload header. Exact when the chunk is a
 * multiple of the codec's group and block sizes, which the function picks
 * (256 tokens, or a multiple of 16 x group and 16 x block up to 2^18).
 * out->struct_size must be set (KVT_MODEL_KV_RATE_INIT); *out is written only on
 * success. Returns 0, -EINVAL (NULL spec or out, struct_size too small),
 * KVT_ESPEC, KVT_ESHAPE (the model is invalid, or the codec cannot encode
 * its shape, e.g. an i4 group that does not divide the head dim) or
 * KVT_ETOOBIG. */
KVT_API int kvt_model_kv_rate_get(kvt_ctx *ctx, const kvt_model_arch *m, const kvt_codec_spec *spec,
                                  kvt_model_kv_rate *out);

/* KV bytes one sequence holds at context tokens:
 * full_bytes * tokens + window_bytes * min(tokens, window). */
KVT_API double kvt_model_seq_bytes(const kvt_model_kv_rate *r, double tokens);

/* Mean bytes per element (16-bit source = 2.0). */
KVT_API double kvt_model_bytes_per_element(const kvt_model_kv_rate *r);

/* --- decode bandwidth ----------------------------------------------------- */

typedef struct kvt_model_projection_config {
  size_t struct_size; /* sizeof(kvt_model_projection_config) */
  double batch;       /* sequences decoded together, > 0 */
  double context;     /* tokens of context per sequence, > 0 */
  double step_ms;     /* target inter-token latency tau, ms, > 0 */
  double spec_k;      /* tokens accepted per verification; 0 or 1: none */
} kvt_model_projection_config;

#define KVT_MODEL_PROJECTION_CONFIG_INIT \
  { sizeof(kvt_model_projection_config), 1.0, 0.0, 10.0, 1.0 }

typedef struct kvt_model_projection {
  double seq_bytes;       /* KV of one sequence at the context */
  double bytes_per_token; /* seq_bytes / context (lower with windowed layers) */
  double step_bytes;      /* batch x seq_bytes: KV read per decode step */
  double required_Bps;    /* step_bytes / (tau x k) */
  uint64_t reserved[4];   /* zeroed by kvt_model_project: later outputs */
} kvt_model_projection;

/* Projects the KV traffic of decode. Returns 0 or -EINVAL for a config out
 * of range (NULL, struct_size too small, non-positive or non-finite). */
KVT_API int kvt_model_project(kvt_ctx *ctx, const kvt_model_kv_rate *r,
                              const kvt_model_projection_config *c, kvt_model_projection *out);

/* required / link: how many times short a link falls (< 1: it suffices). */
KVT_API double kvt_model_shortfall(double required_Bps, double link_Bps);

/* The longest context a link of link_Bps can feed at the config's batch,
 * tau and k (c->context is ignored), into *tokens (whole tokens, rounded
 * down; INFINITY when every layer is windowed and the link feeds the
 * windows). Returns 0 or -EINVAL. */
KVT_API int kvt_model_max_context(kvt_ctx *ctx, const kvt_model_kv_rate *r,
                                  const kvt_model_projection_config *c, double link_Bps,
                                  double *tokens);

/* Amdahl bound on the decode speedup from storing KV at a fraction r of
 * its bytes when KV is a fraction f of the bytes a step reads:
 * 1 / (1 - f (1 - r)). f and r in [0, 1]; NAN outside. */
KVT_API double kvt_model_amdahl_bound(double f, double r);

/* --- links ---------------------------------------------------------------- */

/* Library-owned and read through a pointer only (callers never allocate
 * one), so fields may be appended without a size field or reserved tail. */
typedef struct kvt_model_link {
  const char *name; /* "pcie5-x16" */
  const char *what; /* "PCIe 5.0 x16, one direction" */
  double GBps;      /* nominal, 1e9 bytes per second */
} kvt_model_link;

/* Preset link i (fixed order: HBM, NVLink, PCIe, CXL, RDMA, NVMe), NULL past
 * the last. The returned struct is static. */
KVT_API const kvt_model_link *kvt_model_link_preset(size_t i);
/* The preset called name (case-insensitive), or NULL. */
KVT_API const kvt_model_link *kvt_model_link_find(const char *name);

/* --- placement ------------------------------------------------------------ */

/* Prefill FLOPs of tokens tokens, the model stated: 2 x active params x T
 * (every weight is one multiply-add per token) plus, per layer,
 * 2 x P x q_heads x (qk_dim + pv_dim), where P is the number of causal
 * (query, key) pairs: T (T + 1) / 2, or sum over t of min(t, window) on a
 * windowed layer. */
KVT_API double kvt_model_prefill_flops(const kvt_model_arch *m, double tokens);

/* kvt_model_prefill_flops() / (tflops x 1e12 x mfu): seconds to recompute the
 * prefill of tokens tokens (tflops 0: 989, H100 SXM dense bf16; mfu 0: 0.5). */
KVT_API double kvt_model_prefill_seconds(const kvt_model_arch *m, double tokens, double tflops,
                                         double mfu);

typedef struct kvt_model_advice_config {
  size_t struct_size;    /* sizeof(kvt_model_advice_config) */
  double hbm_free_bytes; /* HBM left for KV after weights and activations */
  double batch;          /* sequences wanted at once */
  double context;        /* tokens per sequence */
  double tflops;         /* dense 16-bit peak of the GPU, TFLOP/s; 0: 989 (H100 SXM) */
  double mfu;            /* fraction of peak prefill reaches; 0: 0.5 */
} kvt_model_advice_config;

#define KVT_MODEL_ADVICE_CONFIG_INIT \
  { sizeof(kvt_model_advice_config), 0.0, 1.0, 0.0, 0.0, 0.0 }

typedef struct kvt_model_advice {
  double seq_bytes;      /* KV of one sequence at the context, this codec */
  double sequences_fit;  /* whole sequences HBM holds: floor(free / seq_bytes) */
  int batch_fits;        /* sequences_fit >= batch */
  double prefill_flops;  /* kvt_model_prefill_flops() at the context */
  double prefill_s;      /* prefill_flops / (tflops x 1e12 x mfu) */
  uint64_t reserved[4];  /* zeroed by kvt_model_advise: later outputs */
} kvt_model_advice;

/* HBM capacity and recompute cost of one codec's KV. Returns 0 or -EINVAL. */
KVT_API int kvt_model_advise(kvt_ctx *ctx, const kvt_model_arch *m, const kvt_model_kv_rate *r,
                             const kvt_model_advice_config *c, kvt_model_advice *out);

/* Seconds to restore bytes over a link of link_Bps at efficiency (measured
 * / nominal, (0, 1]; 0 means 1). INFINITY for a link of 0 bytes/s. */
KVT_API double kvt_model_restore_seconds(double bytes, double link_Bps, double efficiency);

#ifdef __cplusplus
}
#endif
#endif
