/* core/error.c - the error table's messages and names. */
#include <errno.h>
#include <string.h>

#include "kvtier/error.h"

const char *kvt_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
#define KVT_ERROR_MSG_(name, value, msg) \
  case value:                             \
    return msg;
    KVT_ERROR_TABLE(KVT_ERROR_MSG_)
#undef KVT_ERROR_MSG_
  default:
    break;
  }
  /* strerrordesc_np (glibc 2.32+) gives static text, or NULL for an unknown
   * code, where strerror would format into a shared buffer. */
  if (err < 0 && err > -4000) {
    const char *s = strerrordesc_np(-err);
    if (s)
      return s;
  }
  return "unknown error";
}

const char *kvt_err_name(int err) {
  switch (err) {
  case 0:
    return "OK";
#define KVT_ERROR_NAME_(name, value, msg) \
  case value:                              \
    return "KVT_" #name;
    KVT_ERROR_TABLE(KVT_ERROR_NAME_)
#undef KVT_ERROR_NAME_
#define KVT_ERRNO_NAME_(e) \
  case -e:                 \
    return #e;
    KVT_ERRNO_NAME_(EPERM)
    KVT_ERRNO_NAME_(ENOENT)
    KVT_ERRNO_NAME_(EIO)
    KVT_ERRNO_NAME_(EBADF)
    KVT_ERRNO_NAME_(EAGAIN)
    KVT_ERRNO_NAME_(ENOMEM)
    KVT_ERRNO_NAME_(EACCES)
    KVT_ERRNO_NAME_(EFAULT)
    KVT_ERRNO_NAME_(EBUSY)
    KVT_ERRNO_NAME_(EEXIST)
    KVT_ERRNO_NAME_(ENOTDIR)
    KVT_ERRNO_NAME_(EISDIR)
    KVT_ERRNO_NAME_(EINVAL)
    KVT_ERRNO_NAME_(EFBIG)
    KVT_ERRNO_NAME_(ENOSPC)
    KVT_ERRNO_NAME_(EROFS)
    KVT_ERRNO_NAME_(EPIPE)
    KVT_ERRNO_NAME_(ENAMETOOLONG)
    KVT_ERRNO_NAME_(ENOSYS)
    KVT_ERRNO_NAME_(ETIMEDOUT)
    KVT_ERRNO_NAME_(ECONNREFUSED)
    KVT_ERRNO_NAME_(ECONNRESET)
#undef KVT_ERRNO_NAME_
  default:
    return "EUNKNOWN";
  }
}
