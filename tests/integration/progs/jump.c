/* A legacy library that calls back into its caller while guarded. */
int through(void (*cb)(void))
{
	cb();
	return 1;
}
