/*
 * test_secure.py's launcher, linked statically so that /etc/ld.so.preload
 * never applies to it: in a private mount namespace of its own it mounts
 * an overlay on /etc (the test's upper directory: its ld.so.preload and
 * lockshim/), becomes uid/gid UID:GID with no supplementary groups and
 * executes PROGRAM with the environment it was given. The namespace, and
 * the overlay with it, goes when PROGRAM ends; the machine's /etc is never
 * written. Usage: secure_launch UPPER WORK UID GID PROGRAM [ARG...]
 */
#define _GNU_SOURCE
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char opts[8192];
	uid_t uid;
	gid_t gid;

	if (argc < 6) {
		fprintf(stderr, "usage: secure_launch UPPER WORK UID GID PROGRAM [ARG...]\n");
		return 2;
	}
	uid = (uid_t)atol(argv[3]);
	gid = (gid_t)atol(argv[4]);
	snprintf(opts, sizeof(opts), "lowerdir=/etc,upperdir=%s,workdir=%s", argv[1], argv[2]);
	if (unshare(CLONE_NEWNS) || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
	    mount("overlay", "/etc", "overlay", 0, opts)) {
		perror("secure_launch: namespace");
		return 2;
	}
	if (setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid)) {
		perror("secure_launch: credentials");
		return 2;
	}
	execv(argv[5], argv + 5);
	perror("secure_launch: exec");
	return 2;
}
