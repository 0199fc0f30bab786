/* kvtier/version.h - library and payload format versions. */
#ifndef KVTIER_VERSION_H
#define KVTIER_VERSION_H

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 3
#define KVT_VERSION_PATCH 1
/* One number that orders releases: major*10000 + minor*100 + patch. */
#define KVT_VERSION_NUMBER \
  (KVT_VERSION_MAJOR * 10000 + KVT_VERSION_MINOR * 100 + KVT_VERSION_PATCH)

/* The payload format this build writes. Readers accept this major version
 * only; see serde/FORMAT.md. */
#define KVT_FORMAT_VERSION 1

#endif
