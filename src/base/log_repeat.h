/*-------------------------------------------------------------------------
 *
 * log_repeat.h
 *	  The limit on repeated log lines (log_repeat.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_LOG_REPEAT_H
#define OBX_LOG_REPEAT_H

/* obx_log_allowed lets the same line through once per this many ms. */
#define OBX_LOG_REPEAT_MS 60000
extern bool obx_log_allowed(const char *what, int64 *suppressed);

#endif /* OBX_LOG_REPEAT_H */
