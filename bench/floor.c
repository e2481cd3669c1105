/* SPDX-License-Identifier: MIT */
/*
 * floor PORT N - what plain hiredis costs on this machine, per operation
 * (medians, ns): a PING round trip, and SET NX PX + EVALSHA compare-and-
 * delete (acquire + release). Prints "ping_ns pair_ns".
 */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[2]) : 10000;
	long long *t = calloc((size_t)n, sizeof(*t)), ping, pair;
	redisContext *c = redisConnect("127.0.0.1", atoi(argv[1]));
	redisReply *r;
	char sha[41];

	if (!c || c->err)
		return 3;
	r = redisCommand(c, "SCRIPT LOAD %s", "if redis.call('get', KEYS[1]) == ARGV[1] "
			 "then return redis.call('del', KEYS[1]) else return 0 end");
	snprintf(sha, sizeof(sha), "%s", r->str);
	freeReplyObject(r);
	for (int i = 0; i < n; i++) {
		long long t0 = now_ns();

		freeReplyObject(redisCommand(c, "PING"));
		t[i] = now_ns() - t0;
	}
	qsort(t, (size_t)n, sizeof(*t), cmp);
	ping = t[n / 2];
	for (int i = 0; i < n; i++) {
		long long t0 = now_ns();

		freeReplyObject(redisCommand(c, "SET floor-lock tok NX PX 10000"));
		freeReplyObject(redisCommand(c, "EVALSHA %s 1 floor-lock tok", sha));
		t[i] = now_ns() - t0;
	}
	qsort(t, (size_t)n, sizeof(*t), cmp);
	pair = t[n / 2];
	printf("%lld %lld\n", ping, pair);
	return 0;
}
