/* SPDX-License-Identifier: MIT */
/*
 * dlpath.h - resolving a bare library name with the caller's RUNPATH/RPATH.
 */
#ifndef LOCKSHIM_DLPATH_H
#define LOCKSHIM_DLPATH_H

/*
 * Returns the full path under which the object containing caller would find
 * file through its DT_RUNPATH or DT_RPATH, or NULL when file has a slash, is
 * already loaded, or is not found there (then plain dlopen(file) is right).
 * The caller frees the result.
 */
char *dlpath_search(const void *caller, const char *file);

#endif
