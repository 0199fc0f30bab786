/* kvtier/export.h - symbol visibility for the public API. */
#ifndef KVTIER_EXPORT_H
#define KVTIER_EXPORT_H

#if defined(_WIN32)
#define KVT_API
#elif defined(__GNUC__)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

#endif
