/*
 * own_hiredis PORT: a program with its own (shared) hiredis. It calls a
 * guarded function, then uses its hiredis to SET and GET a key, and prints
 * what it read: the shim's static, hidden copy must not interfere.
 */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>

int hold_call(int ms);

int main(int argc, char **argv)
{
	redisContext *c = redisConnect("127.0.0.1", atoi(argv[1]));
	redisReply *r;

	if (!c || c->err)
		return 3;
	printf("call rc=%d\n", hold_call(0));
	freeReplyObject(redisCommand(c, "SET own-hiredis %s", "works"));
	r = redisCommand(c, "GET own-hiredis");
	printf("get %s\n", r && r->str ? r->str : "(nil)");
	freeReplyObject(r);
	redisFree(c);
	return 0;
}
