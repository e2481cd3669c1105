/* SPDX-License-Identifier: MIT */
/*
 * worker MODE PATH K [PORT] - one benchmark process.
 *
 * Waits for one byte on stdin (the start barrier), then:
 *   section   K calls of section(PATH) (guarded when the shim is preloaded)
 *   poll      the same, around a plain C lock: SET NX PX, 1 ms sleep between
 *             tries, EVALSHA compare-and-delete (the naive poller)
 *   flock     the same, around flock(2) of the file PORT names (opened,
 *             locked, unlocked and closed each time: the local backend's floor)
 *   noop      K calls of bench_noop(), timed as a whole
 *   noop-wide K calls of libsection's bench_noop_wide() (through the PLT),
 *             timed as a whole
 *   noop-exe  K calls of bench_noop_exe(), defined here and called directly
 *             (not exported, no PLT: only entry patching can guard it),
 *             timed as a whole
 * Prints "elapsed_ns H handoffs" and, for section/poll, the wait of every
 * section (call to entry, ns) on the next line.
 */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

long section(const char *path);
int bench_noop(int x);
int bench_noop_wide(int x);
extern long long section_entered_ns;
extern long section_handoffs;

/* noipa: the calls stay real calls of this very function (no inlining, no
 * clone, no pure/const deduction deleting them). */
__attribute__((noipa)) int bench_noop_exe(int x)
{
	return x * 7 + 13;
}

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static const char release_lua[] =
	"if redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('del', KEYS[1]) else return 0 end";

int main(int argc, char **argv)
{
	const char *mode = argv[1], *path = argv[2];
	int k = atoi(argv[3]), poll = !strcmp(mode, "poll"), lockf = !strcmp(mode, "flock");
	long long *waits = calloc((size_t)k, sizeof(*waits)), t0, start;
	redisContext *c = NULL;
	char token[32], sha[41] = "";
	char go;
	int fd = -1;

	if (poll) {
		redisReply *r;

		c = redisConnect("127.0.0.1", atoi(argv[4]));
		if (!c || c->err)
			return 3;
		r = redisCommand(c, "SCRIPT LOAD %s", release_lua);
		snprintf(sha, sizeof(sha), "%s", r->str);
		freeReplyObject(r);
		snprintf(token, sizeof(token), "%d", (int)getpid());
	}
	if (read(0, &go, 1) != 1)
		return 4;
	start = now_ns();
	if (!strcmp(mode, "noop") || !strcmp(mode, "noop-wide") || !strcmp(mode, "noop-exe")) {
		if (!strcmp(mode, "noop"))
			for (int i = 0; i < k; i++)
				bench_noop(i);
		else if (!strcmp(mode, "noop-wide"))
			for (int i = 0; i < k; i++)
				bench_noop_wide(i);
		else
			for (int i = 0; i < k; i++)
				bench_noop_exe(i);
		printf("%lld 0\n", now_ns() - start);
		return 0;
	}
	for (int i = 0; i < k; i++) {
		t0 = now_ns();
		if (poll) {
			for (;;) {
				redisReply *r = redisCommand(c, "SET poll-lock %s NX PX 10000", token);
				int ok = r && r->type == REDIS_REPLY_STATUS;

				freeReplyObject(r);
				if (ok)
					break;
				usleep(1000);
			}
		}
		if (lockf) {
			fd = open(argv[4], O_RDWR | O_CREAT | O_CLOEXEC, 0644);
			if (fd < 0 || flock(fd, LOCK_EX) != 0)
				return 6;
		}
		if (section(path) < 0)
			return 5;
		if (lockf) {
			flock(fd, LOCK_UN);
			close(fd);
		}
		waits[i] = section_entered_ns - t0;
		if (poll)
			freeReplyObject(redisCommand(c, "EVALSHA %s 1 poll-lock %s", sha, token));
	}
	printf("%lld %ld\n", now_ns() - start, section_handoffs);
	for (int i = 0; i < k; i++)
		printf("%lld%c", waits[i], i + 1 < k ? ' ' : '\n');
	return 0;
}
