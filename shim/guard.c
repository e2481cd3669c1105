/* SPDX-License-Identifier: MIT */
/* guard.c - storage for the per-thread re-entry guard (see guard.h). */
#include "guard.h"

__thread int guard_depth __attribute__((tls_model("initial-exec")));
