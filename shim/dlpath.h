/* SPDX-License-Identifier: MIT */
/*
 * dlpath.h - resolving a library name as the caller's dlopen would.
 */
#ifndef LOCKSHIM_DLPATH_H
#define LOCKSHIM_DLPATH_H

/*
 * Returns file with $ORIGIN expanded to the directory of the object
 * containing caller; or, for a bare name, the full path under which that
 * object would find file through its DT_RUNPATH or DT_RPATH. NULL when
 * neither applies (file has a slash and no $ORIGIN, is already loaded, or
 * is not found there): then plain dlopen(file) is right. The caller frees
 * the result.
 */
char *dlpath_search(const void *caller, const char *file);

#endif
