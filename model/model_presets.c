/* model/model_presets.c - the bandwidth model's inputs: model presets (shapes
 * from each model's published config.json), link presets (nominal
 * bandwidths), and the Hugging Face config.json reader. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <strings.h>

#include "kvt_internal.h"
#include "kvtier/model.h"
#include "kvtier/payload.h"
#include "model_json.h"

/* --- models ---------------------------------------------------------------- */

typedef struct model_preset {
  const char *name, *alias1, *alias2;
  uint32_t layers, q_heads, kv_heads, k_dim, v_dim;
  uint32_t window, global_every; /* window layers: all but every global_every-th */
  uint32_t qk_dim, pv_dim, max_context, weight_bits, mla;
  double params, active_params;
} model_preset;

/* Values are the config.json fields of the named checkpoints (layers =
 * num_hidden_layers, KV heads = num_key_value_heads, dims = head_dim or
 * hidden_size / num_attention_heads); parameter counts are the published
 * ones. max_context is the longest context the model card supports (with
 * YaRN where the card says so). */
static const model_preset presets[] = {
    /* meta-llama/Llama-3.1-8B */
    {"llama-3.1-8b", "llama3.1-8b", NULL, 32, 32, 8, 128, 128, 0, 0, 0, 0, 131072, 16, 0,
     8.03e9, 0},
    /* meta-llama/Llama-3.1-70B */
    {"llama-3.1-70b", "llama3.1-70b", NULL, 80, 64, 8, 128, 128, 0, 0, 0, 0, 131072, 16, 0,
     70.6e9, 0},
    /* mistralai/Mistral-7B-v0.3 (sliding_window null; v0.1 had 4096) */
    {"mistral-7b", "mistral-7b-v0.3", NULL, 32, 32, 8, 128, 128, 0, 0, 0, 0, 32768, 16, 0,
     7.25e9, 0},
    /* mistralai/Mistral-Small-24B-Base-2501: head_dim 128, not 5120/32 */
    {"mistral-small-24b", "mistral-small-24b-2501", NULL, 40, 32, 8, 128, 128, 0, 0, 0, 0, 32768,
     16, 0, 23.6e9, 0},
    /* Qwen/Qwen2.5-0.5B: hidden 896 / 14 heads */
    {"qwen2.5-0.5b", NULL, NULL, 24, 14, 2, 64, 64, 0, 0, 0, 0, 32768, 16, 0, 0.494e9, 0},
    /* Qwen/Qwen2.5-1.5B: hidden 1536 / 12 heads */
    {"qwen2.5-1.5b", NULL, NULL, 28, 12, 2, 128, 128, 0, 0, 0, 0, 32768, 16, 0, 1.54e9, 0},
    /* Qwen/Qwen2.5-7B: hidden 3584 / 28 heads; 128K with YaRN */
    {"qwen2.5-7b", NULL, NULL, 28, 28, 4, 128, 128, 0, 0, 0, 0, 131072, 16, 0, 7.61e9, 0},
    /* Qwen/Qwen2.5-72B */
    {"qwen2.5-72b", NULL, NULL, 80, 64, 8, 128, 128, 0, 0, 0, 0, 131072, 16, 0, 72.7e9, 0},
    /* Qwen/Qwen3-8B: head_dim 128; 128K with YaRN */
    {"qwen3-8b", NULL, NULL, 36, 32, 8, 128, 128, 0, 0, 0, 0, 131072, 16, 0, 8.19e9, 0},
    /* microsoft/phi-4: hidden 5120 / 40 heads, 10 KV heads */
    {"phi-4", "phi-4-14b", "phi4", 40, 40, 10, 128, 128, 0, 0, 0, 0, 16384, 16, 0, 14.7e9, 0},
    /* google/gemma-3-12b: head_dim 256, sliding_window 1024, 5 local : 1 global */
    {"gemma3-12b", "gemma-3-12b", NULL, 48, 16, 8, 256, 256, 1024, 6, 0, 0, 131072, 16, 0,
     12.2e9, 0},
    /* deepseek-ai/DeepSeek-V3: MLA, kv_lora_rank 512 + qk_rope_head_dim 64 per
     * token per layer; 128 heads of q.k 192 (128 + 64) and p.v 128; FP8
     * weights; 37B of 671B parameters active per token */
    {"deepseek-v3", "deepseek-r1", NULL, 61, 128, 1, 64, 512, 0, 0, 192, 128, 163840, 8, 1,
     671e9, 37e9},
};

#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

static void window_every(kvt_model_arch *m, uint32_t global_every) {
  for (uint32_t l = 0; l < m->layers; l++)
    if (!global_every || (l + 1) % global_every != 0)
      m->window_layers[l / 64] |= 1ull << (l % 64);
}

static void fill_preset(const model_preset *p, kvt_model_arch *out) {
  const kvt_model_arch init = KVT_MODEL_ARCH_INIT;
  *out = init;
  snprintf(out->name, sizeof(out->name), "%s", p->name);
  out->layers = p->layers;
  out->q_heads = p->q_heads;
  out->kv_heads = p->kv_heads;
  out->k_dim = p->k_dim;
  out->v_dim = p->v_dim;
  out->window = p->window;
  if (p->window)
    window_every(out, p->global_every);
  out->qk_dim = p->qk_dim;
  out->pv_dim = p->pv_dim;
  out->max_context = p->max_context;
  out->weight_bits = p->weight_bits;
  out->mla = p->mla;
  out->params = p->params;
  out->active_params = p->active_params;
}

int kvt_model_preset(const char *name, kvt_model_arch *out) {
  if (!name || !out)
    return KVT_ENOTFOUND;
  for (size_t i = 0; i < N_PRESETS; i++) {
    const model_preset *p = &presets[i];
    if (strcasecmp(name, p->name) == 0 || (p->alias1 && strcasecmp(name, p->alias1) == 0) ||
        (p->alias2 && strcasecmp(name, p->alias2) == 0)) {
      fill_preset(p, out);
      return 0;
    }
  }
  return KVT_ENOTFOUND;
}

int kvt_model_preset_at(size_t i, kvt_model_arch *out) {
  if (i >= N_PRESETS || !out)
    return KVT_ENOTFOUND;
  fill_preset(&presets[i], out);
  return 0;
}

/* --- links ----------------------------------------------------------------- */

static const kvt_model_link links[] = {
    {"hbm3-h100", "HBM3, H100 SXM, peak", 3350},
    {"hbm3e-h200", "HBM3e, H200, peak", 4800},
    {"hbm3e-b200", "HBM3e, B200, peak", 8000},
    {"nvlink4", "NVLink 4 (H100/H200), both directions", 900},
    {"nvlink5", "NVLink 5 (B200), both directions", 1800},
    {"pcie4-x16", "PCIe 4.0 x16, one direction", 32},
    {"pcie5-x16", "PCIe 5.0 x16, one direction", 64},
    {"cxl2", "CXL 2.0 memory expander", 32},
    {"rdma-400g", "400 Gb/s RDMA NIC", 50},
    {"rdma-200g", "200 Gb/s RDMA NIC", 25},
    {"nvme-gen4", "one NVMe Gen4 x4 SSD, sequential read", 7},
    {"nvme-gen4-x4", "four NVMe Gen4 SSDs, striped", 28},
    {"nvme-gen5", "one NVMe Gen5 x4 SSD, sequential read", 14},
    {"nvme-gen5-x4", "four NVMe Gen5 SSDs, striped", 56},
};

const kvt_model_link *kvt_model_link_preset(size_t i) {
  return i < sizeof(links) / sizeof(links[0]) ? &links[i] : NULL;
}

const kvt_model_link *kvt_model_link_find(const char *name) {
  for (size_t i = 0; name && i < sizeof(links) / sizeof(links[0]); i++)
    if (strcasecmp(name, links[i].name) == 0)
      return &links[i];
  return NULL;
}

/* --- Hugging Face config.json ---------------------------------------------- */

/* Where fields are looked up: a multimodal model's text_config first, then
 * the top level. */
typedef struct hf {
  kvt_ctx *ctx;
  kvt_json top, text;
  int has_text;
  char type[64]; /* model_type */
} hf;

/* The first of keys (NULL-terminated) present and not null. */
static int hf_find(const hf *h, const char *const *keys, kvt_json *out, const char **which) {
  for (const char *const *k = keys; *k; k++) {
    if (h->has_text && kvt_json_member(&h->text, *k, out) == 0 && out->type != KVT_JSON_NULL) {
      *which = *k;
      return 0;
    }
    if (kvt_json_member(&h->top, *k, out) == 0 && out->type != KVT_JSON_NULL) {
      *which = *k;
      return 0;
    }
  }
  return KVT_ENOTFOUND;
}

/* A whole number in [0, max] under one of keys. Missing: KVT_ENOTFOUND,
 * with detail only when required. */
static int hf_uint(const hf *h, const char *const *keys, double max, int required, double *out) {
  kvt_json v;
  const char *which = keys[0];
  if (hf_find(h, keys, &v, &which) != 0)
    return required ? kvt_fail(h->ctx, KVT_ENOTFOUND, "config.json has no \"%s\"", keys[0])
                    : KVT_ENOTFOUND;
  unsigned long long u;
  if (kvt_json_uint(&v, max, &u) != 0)
    return kvt_fail(h->ctx, KVT_ERANGE, "config.json \"%s\": %.*s is not a whole number in 0..%.0f",
                    which, (int)(v.n > 40 ? 40 : v.n), v.p, max);
  *out = (double)u;
  return 0;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

static double opt(const hf *h, const char *const *keys, double max, double dflt, int *rc) {
  double v = 0;
  const int e = hf_uint(h, keys, max, 0, &v);
  if (e == KVT_ENOTFOUND)
    return dflt;
  if (e && !*rc)
    *rc = e;
  return e ? dflt : v;
}

static int hf_bool(const hf *h, const char *key, int dflt) {
  kvt_json v;
  const char *which;
  if (hf_find(h, KEYS(key), &v, &which) != 0 || v.type != KVT_JSON_BOOL)
    return dflt;
  return v.p[0] == 't';
}

/* Which layers read a bounded window: layer_types, else a pattern, else
 * Qwen2's max_window_layers, else every layer. */
static int hf_windows(const hf *h, kvt_model_arch *m) {
  int rc = 0;
  kvt_json sw;
  const char *key;
  if (hf_find(h, KEYS("sliding_window"), &sw, &key) != 0 || sw.type == KVT_JSON_BOOL)
    return 0; /* absent, null or false: no window */
  const double w = opt(h, KEYS("sliding_window"), 4294967295.0, 0, &rc);
  if (rc || w == 0)
    return rc;
  if (hf_bool(h, "use_sliding_window", 1) == 0)
    return 0;
  m->window = (uint32_t)w;
  kvt_json types, t;
  const char *which;
  if (hf_find(h, KEYS("layer_types"), &types, &which) == 0 && types.type == KVT_JSON_ARRAY) {
    size_t pos = 0;
    uint32_t l = 0;
    while (kvt_json_next(&types, &pos, NULL, &t)) {
      if (l >= m->layers)
        return kvt_fail(h->ctx, KVT_ESHAPE, "layer_types has more than %u entries", m->layers);
      if (kvt_json_is(&t, "sliding_attention"))
        m->window_layers[l / 64] |= 1ull << (l % 64);
      l++;
    }
    if (l != m->layers)
      return kvt_fail(h->ctx, KVT_ESHAPE, "layer_types has %u entries for %u layers", l,
                      m->layers);
    return 0;
  }
  const int gemma3 = strncmp(h->type, "gemma3", 6) == 0, gemma2 = strcmp(h->type, "gemma2") == 0;
  double every = opt(h, KEYS("sliding_window_pattern", "_sliding_window_pattern"), 1e6,
                     gemma3 ? 6 : gemma2 ? 2 : 0, &rc);
  if (rc)
    return rc;
  if (every > 0) {
    window_every(m, (uint32_t)every);
    return 0;
  }
  if (hf_bool(h, "use_sliding_window", 0)) { /* Qwen2: layers from max_window_layers on */
    const double from = opt(h, KEYS("max_window_layers"), KVT_ARCH_MAX_LAYERS, 0, &rc);
    for (uint32_t l = (uint32_t)from; l < m->layers; l++)
      m->window_layers[l / 64] |= 1ull << (l % 64);
    return rc;
  }
  window_every(m, 0);
  return 0;
}

/* Parameters from shapes: embeddings (twice unless tied), attention
 * projections, gated MLPs (3 matrices) or MoE experts; norms and biases
 * are left out (under 0.1%). */
static int hf_params(const hf *h, kvt_model_arch *m, double hidden, double mla_q_lora,
                     double mla_kv_lora, double nope) {
  int rc = 0;
  const double vocab = opt(h, KEYS("vocab_size"), 1e9, 0, &rc);
  const double inter = opt(h, KEYS("intermediate_size", "ffn_dim", "hidden_dim"), 1e9, 0, &rc);
  const double experts = opt(h, KEYS("n_routed_experts", "num_local_experts", "num_experts"), 1e6,
                             0, &rc);
  const double per_tok = opt(h, KEYS("num_experts_per_tok", "num_experts_per_token"), 1e6, 0, &rc);
  const double moe_inter = opt(h, KEYS("moe_intermediate_size"), 1e9, inter, &rc);
  const double shared = opt(h, KEYS("n_shared_experts"), 1e6, 0, &rc);
  const double dense_first = opt(h, KEYS("first_k_dense_replace"), KVT_ARCH_MAX_LAYERS, 0, &rc);
  if (rc)
    return rc;
  const double qh = m->q_heads, dqk = m->qk_dim ? m->qk_dim : m->k_dim;
  const double dv = m->pv_dim ? m->pv_dim : (m->v_dim ? m->v_dim : m->k_dim);
  double attn;
  if (m->mla)
    attn = (mla_q_lora > 0 ? hidden * mla_q_lora + mla_q_lora * qh * dqk : hidden * qh * dqk) +
           hidden * (mla_kv_lora + m->k_dim) + mla_kv_lora * qh * (nope + dv) + qh * dv * hidden;
  else
    attn = hidden * qh * dqk + 2 * hidden * m->kv_heads * m->k_dim + qh * dv * hidden;
  const double mlp = 3 * hidden * inter, expert = 3 * hidden * moe_inter;
  const double moe_layers = experts > 0 ? m->layers - fmin(dense_first, m->layers) : 0;
  const double dense_layers = m->layers - moe_layers;
  const double embed = vocab * hidden * (hf_bool(h, "tie_word_embeddings", 0) ? 1 : 2);
  const double common = embed + m->layers * attn + dense_layers * mlp;
  m->params = common + moe_layers * ((experts + shared) * expert + hidden * experts);
  m->active_params = experts > 0 ? common + moe_layers * ((per_tok + shared) * expert) : 0;
  return 0;
}

static uint32_t hf_weight_bits(const hf *h) {
  kvt_json q, v;
  const char *which;
  if (hf_find(h, KEYS("quantization_config"), &q, &which) == 0 && q.type == KVT_JSON_OBJECT) {
    unsigned long long bits;
    if (kvt_json_member(&q, "bits", &v) == 0 && kvt_json_uint(&v, 32, &bits) == 0 && bits)
      return (uint32_t)bits;
    if (kvt_json_member(&q, "quant_method", &v) == 0 && kvt_json_is(&v, "fp8"))
      return 8;
  }
  if (hf_find(h, KEYS("torch_dtype", "dtype"), &v, &which) == 0 && kvt_json_is(&v, "float32"))
    return 32;
  return 16;
}

/* Heads and dims: standard attention, or MLA when kv_lora_rank is set. */
static int hf_attention(hf *h, kvt_model_arch *m, double *hidden, double *q_lora, double *kv_lora,
                        double *nope) {
  double v;
  int rc;
  if ((rc = hf_uint(h, KEYS("num_hidden_layers", "n_layers", "num_layers", "n_layer"),
                    KVT_ARCH_MAX_LAYERS, 1, &v)) != 0)
    return rc;
  m->layers = (uint32_t)v;
  if ((rc = hf_uint(h, KEYS("num_attention_heads", "n_heads", "n_head"), KVT_MAX_HEADS * 64.0, 1,
                    &v)) != 0)
    return rc;
  m->q_heads = (uint32_t)v;
  rc = 0;
  *hidden = opt(h, KEYS("hidden_size", "dim", "d_model", "n_embd"), 1e7, 0, &rc);
  m->max_context = (uint32_t)opt(h, KEYS("max_position_embeddings"), 4294967295.0, 0, &rc);
  *kv_lora = opt(h, KEYS("kv_lora_rank"), KVT_MAX_HEAD_DIM, 0, &rc);
  if (rc)
    return rc;
  if (*kv_lora > 0) { /* MLA: one latent + RoPE key per token per layer */
    m->mla = 1;
    m->kv_heads = 1;
    m->v_dim = (uint32_t)*kv_lora;
    if ((rc = hf_uint(h, KEYS("qk_rope_head_dim"), KVT_MAX_HEAD_DIM, 1, &v)) != 0)
      return rc;
    m->k_dim = (uint32_t)v;
    *nope = opt(h, KEYS("qk_nope_head_dim"), KVT_MAX_HEAD_DIM, 0, &rc);
    m->qk_dim = (uint32_t)(*nope + m->k_dim);
    m->pv_dim = (uint32_t)opt(h, KEYS("v_head_dim"), KVT_MAX_HEAD_DIM, *nope, &rc);
    *q_lora = opt(h, KEYS("q_lora_rank"), 1e7, 0, &rc);
    return rc;
  }
  const int multi_query = hf_bool(h, "multi_query", 0);
  m->kv_heads = (uint32_t)opt(h, KEYS("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
                              KVT_MAX_HEADS, multi_query ? 1 : m->q_heads, &rc);
  const int gemma3 = strncmp(h->type, "gemma3", 6) == 0;
  double dim = opt(h, KEYS("head_dim"), KVT_MAX_HEAD_DIM, gemma3 ? 256 : 0, &rc);
  if (rc)
    return rc;
  if (dim == 0) {
    if (*hidden == 0 || fmod(*hidden, m->q_heads) != 0)
      return kvt_fail(h->ctx, KVT_ENOTFOUND,
                      "config.json has no head_dim, and hidden_size %.0f is not a multiple of "
                      "%u heads",
                      *hidden, m->q_heads);
    dim = *hidden / m->q_heads;
  }
  m->k_dim = (uint32_t)dim;
  return 0;
}

int kvt_model_from_hf_config(kvt_ctx *ctx, const char *text, size_t len, const char *name,
                             kvt_model_arch *out) {
  hf h;
  memset(&h, 0, sizeof(h));
  h.ctx = ctx;
  if (!out || out->struct_size < sizeof(kvt_model_arch))
    return kvt_fail(ctx, -EINVAL, "kvt_model_from_hf_config: output struct_size too small");
  int rc = kvt_json_parse(ctx, text, len, &h.top);
  if (rc)
    return rc;
  if (h.top.type != KVT_JSON_OBJECT)
    return kvt_fail(ctx, KVT_ECORRUPT, "config.json is not a JSON object");
  h.has_text = kvt_json_member(&h.top, "text_config", &h.text) == 0 &&
               h.text.type == KVT_JSON_OBJECT;
  kvt_json v;
  const char *which;
  if (hf_find(&h, KEYS("model_type"), &v, &which) == 0)
    kvt_json_string(&v, h.type, sizeof(h.type)); /* a truncated type matches nothing */
  kvt_model_arch m = KVT_MODEL_ARCH_INIT;
  double hidden = 0, q_lora = 0, kv_lora = 0, nope = 0;
  if ((rc = hf_attention(&h, &m, &hidden, &q_lora, &kv_lora, &nope)) != 0 ||
      (rc = hf_windows(&h, &m)) != 0)
    return rc;
  m.weight_bits = hf_weight_bits(&h);
  if (hidden > 0 && (rc = hf_params(&h, &m, hidden, q_lora, kv_lora, nope)) != 0)
    return rc;
  char path[256] = "";
  if (!name && kvt_json_member(&h.top, "_name_or_path", &v) == 0 &&
      kvt_json_string(&v, path, sizeof(path)) == 0 && path[0])
    name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path; /* "org/model" -> "model" */
  if (!name || !*name)
    name = h.type[0] ? h.type : "config.json";
  snprintf(m.name, sizeof(m.name), "%.*s", KVT_ARCH_NAME_MAX - 1, name);
  if ((rc = kvt_model_validate(ctx, &m)) != 0)
    return rc;
  *out = m;
  return 0;
}
