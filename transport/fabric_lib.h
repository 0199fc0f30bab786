/* transport/fabric_lib.h - the functions of libfabric that kvtier calls by
 * name, resolved from libfabric.so.1 when the first endpoint opens
 * (fabric_lib.c) rather than linked: loading libfabric runs its providers'
 * start-up code, which every program linking libkvtier would pay for.
 * Everything else kvtier uses (fi_domain, fi_send, fi_close, ...) is static
 * inline in libfabric's headers, a call through the ops table of an object
 * these return, and fi_allocinfo() is dupinfo(NULL). Internal to
 * transport/. */
#ifndef KVT_FABRIC_LIB_H
#define KVT_FABRIC_LIB_H

#include <stddef.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

/* The prototypes are the headers' own (__typeof__ names no symbol). */
typedef struct kvt_fi_lib {
  __typeof__(fi_getinfo) *getinfo;
  __typeof__(fi_freeinfo) *freeinfo;
  __typeof__(fi_dupinfo) *dupinfo;
  __typeof__(fi_fabric) *fabric;
  __typeof__(fi_strerror) *errstr;
} kvt_fi_lib;

/* The table, loading libfabric.so.1 on the first call (once per process,
 * thread-safe; it stays loaded). NULL when it cannot be loaded or lacks a
 * function, the same reason every time, in err (NUL-terminated; err_cap
 * may be 0). */
const kvt_fi_lib *kvt_fi_lib_get(char *err, size_t err_cap);

#endif
