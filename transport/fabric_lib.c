/* transport/fabric_lib.c - libfabric.so.1 loaded on first use
 * (fabric_lib.h): libkvtier does not link it, so a program that opens no
 * fabric tier and no server never loads it (nor the provider libraries it
 * pulls in, whose start-up took about 0.2 s of every `kvtier` run).
 *
 * Symbol versions: a program linked against libfabric binds each function
 * to the version that was the default when it was linked, and a newer
 * libfabric keeps serving that version's structure layouts. CMake reads
 * those defaults from the library the build compiles against
 * (KVT_FI_VER_<name>, e.g. "FABRIC_1.3") and they are asked for by
 * dlvsym, so a newer libfabric gives what linking would have; without
 * them, dlsym takes the library's defaults.
 *
 * Signals: loading libfabric 1.17 (Debian's) runs libinfinipath's start-up,
 * which installs handlers for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and
 * SIGABRT that exit(1). Linked, that ran before main and the program's own
 * handlers replaced it; loaded later, it would replace the program's (a
 * kvtier-server's SIGTERM drain became exit 1). So every disposition the
 * load changes is put back as it was. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "fabric_lib.h"

#define FI_SONAME "libfabric.so.1"

#ifndef KVT_FI_VER_fi_getinfo
#define KVT_FI_VER_fi_getinfo NULL
#endif
#ifndef KVT_FI_VER_fi_freeinfo
#define KVT_FI_VER_fi_freeinfo NULL
#endif
#ifndef KVT_FI_VER_fi_dupinfo
#define KVT_FI_VER_fi_dupinfo NULL
#endif
#ifndef KVT_FI_VER_fi_fabric
#define KVT_FI_VER_fi_fabric NULL
#endif
#ifndef KVT_FI_VER_fi_strerror
#define KVT_FI_VER_fi_strerror NULL
#endif

/* Written once, under pthread_once, then only read. */
static pthread_once_t fi_once = PTHREAD_ONCE_INIT;
static kvt_fi_lib fi_table;
static int fi_ok;
static char fi_why[512];

/* name (at version, when known) from h, or NULL with the reason in fi_why. */
static void *fi_sym(void *h, const char *name, const char *version) {
  dlerror();
  void *p = version ? dlvsym(h, name, version) : dlsym(h, name);
  if (!p) {
    const char *e = dlerror();
    snprintf(fi_why, sizeof(fi_why), "%s lacks %s%s%s: %s", FI_SONAME, name, version ? "@" : "",
             version ? version : "", e ? e : "dlsym failed");
  }
  return p;
}

/* dlopen that leaves the process's signal dispositions as they were (a
 * handler that another thread installs meanwhile may be undone). */
static void *fi_dlopen(void) {
  static struct sigaction before[NSIG]; /* only under fi_once */
  for (int sig = 1; sig < NSIG; sig++)
    if (sigaction(sig, NULL, &before[sig]) != 0)
      before[sig].sa_handler = SIG_ERR; /* not a signal to touch */
  void *h = dlopen(FI_SONAME, RTLD_NOW | RTLD_LOCAL);
  for (int sig = 1; sig < NSIG; sig++) {
    struct sigaction now;
    if (before[sig].sa_handler == SIG_ERR || sigaction(sig, NULL, &now) != 0)
      continue;
    if (now.sa_handler != before[sig].sa_handler || now.sa_flags != before[sig].sa_flags)
      sigaction(sig, &before[sig], NULL);
  }
  return h;
}

static void fi_load(void) {
  void *h = fi_dlopen();
  if (!h) {
    const char *e = dlerror();
    snprintf(fi_why, sizeof(fi_why), "%s not found: %s", FI_SONAME, e ? e : "dlopen failed");
    return;
  }
  kvt_fi_lib t;
  void *p;
  if (!(p = fi_sym(h, "fi_getinfo", KVT_FI_VER_fi_getinfo)))
    goto fail;
  t.getinfo = (__typeof__(t.getinfo))p;
  if (!(p = fi_sym(h, "fi_freeinfo", KVT_FI_VER_fi_freeinfo)))
    goto fail;
  t.freeinfo = (__typeof__(t.freeinfo))p;
  if (!(p = fi_sym(h, "fi_dupinfo", KVT_FI_VER_fi_dupinfo)))
    goto fail;
  t.dupinfo = (__typeof__(t.dupinfo))p;
  if (!(p = fi_sym(h, "fi_fabric", KVT_FI_VER_fi_fabric)))
    goto fail;
  t.fabric = (__typeof__(t.fabric))p;
  if (!(p = fi_sym(h, "fi_strerror", KVT_FI_VER_fi_strerror)))
    goto fail;
  t.errstr = (__typeof__(t.errstr))p;
  fi_table = t;
  fi_ok = 1;
  return; /* never closed: providers keep threads and handlers for the process */
fail:
  dlclose(h);
}

const kvt_fi_lib *kvt_fi_lib_get(char *err, size_t err_cap) {
  pthread_once(&fi_once, fi_load);
  if (fi_ok)
    return &fi_table;
  if (err_cap)
    snprintf(err, err_cap, "%s", fi_why);
  return NULL;
}
