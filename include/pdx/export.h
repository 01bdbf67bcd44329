/* Symbol visibility: everything is hidden except what carries PDX_API. */
#ifndef PDX_EXPORT_H
#define PDX_EXPORT_H

#if defined(__GNUC__)
#define PDX_API __attribute__((visibility("default")))
#else
#define PDX_API
#endif

#endif
