/* kvtier/error.h - error codes shared by every kvtier call.
 *
 * Every fallible call returns int: 0 on success, -errno for an operating
 * system failure (-ENOMEM, -EIO, -ENOENT, ...), or one of the KVT_E* codes
 * below for a library failure. The KVT_E* values are pinned: they never
 * change meaning between releases, so they may be stored and compared.
 * The context keeps a detail string for the last failure
 * (kvt_ctx_last_error()). */
#ifndef KVTIER_ERROR_H
#define KVTIER_ERROR_H

#include "kvtier/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define KVT_ERROR_TABLE(X)                                                   \
  X(EFORMAT, -4001, "not a kvtier payload (bad magic)")                      \
  X(EVERSION, -4002, "unsupported payload format version")                   \
  X(ETRUNC, -4003, "payload truncated")                                      \
  X(ECORRUPT, -4004, "payload structure is corrupt")                         \
  X(ECHECKSUM, -4005, "checksum mismatch")                                   \
  X(ETOOBIG, -4006, "size exceeds a limit")                                  \
  X(EFOREIGN, -4007, "payload belongs to another model, codec or chunk")     \
  X(ESPEC, -4008, "invalid codec spec")                                      \
  X(ENONFINITE, -4009, "NaN or Inf in a tensor that is to be quantized")     \
  X(ERANGE, -4010, "value out of range for the target format")               \
  X(ESHAPE, -4011, "shape, dtype or view does not match")                    \
  X(ENOBUFS, -4012, "output buffer too small")                               \
  X(ENOTFOUND, -4013, "not found")                                           \
  X(EBACKEND, -4014, "backend failure")                                      \
  X(ECUDA, -4015, "CUDA error")                                              \
  X(ENOTSUP, -4016, "feature not built into this library")                  \
  X(EAUTH, -4017, "authentication refused by the remote tier")               \
  X(EPROTO, -4018, "malformed or unexpected reply from a remote peer")

enum kvt_error {
  KVT_OK = 0,
#define KVT_ERROR_ENUM_(name, value, msg) KVT_##name = (value),
  KVT_ERROR_TABLE(KVT_ERROR_ENUM_)
#undef KVT_ERROR_ENUM_
};

/* A static, human-readable message for err (0, -errno or KVT_E*). Never
 * NULL. Thread-safe. */
KVT_API const char *kvt_strerror(int err);

/* The symbolic name of err: "KVT_ECHECKSUM", "ENOMEM", "OK". Unknown codes
 * give "EUNKNOWN". Never NULL. Thread-safe. */
KVT_API const char *kvt_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
