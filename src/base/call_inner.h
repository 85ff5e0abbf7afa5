/*-------------------------------------------------------------------------
 *
 * call_inner.h
 *	  Calling obx's SECURITY DEFINER inner functions from the C functions
 *	  in front of them (call_inner.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_CALL_INNER_H
#define OBX_CALL_INNER_H

#include "fmgr.h"

extern Datum obx_call_inner(FunctionCallInfo fcinfo, const char *inner, Oid lead_type,
							Datum lead);

#endif /* OBX_CALL_INNER_H */
