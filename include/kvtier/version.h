/* kvtier/version.h - library and payload format versions. */
#ifndef KVTIER_VERSION_H
#define KVTIER_VERSION_H

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 3
#define KVT_VERSION_PATCH 3
/* One number that orders releases: major*10000 + minor*100 + patch. */
#define KVT_VERSION_NUMBER \
  (KVT_VERSION_MAJOR * 10000 + KVT_VERSION_MINOR * 100 + KVT_VERSION_PATCH)

/* The payload format this build writes (major version), and the oldest it
 * reads: readers accept majors KVT_FORMAT_OLDEST..KVT_FORMAT_VERSION and
 * refuse others (KVT_EVERSION); see serde/FORMAT.md. Format 2 (kvtier 0.3.2)
 * changed the section checksum to one that can be computed in parallel. */
#define KVT_FORMAT_VERSION 2
#define KVT_FORMAT_OLDEST 1

#endif
