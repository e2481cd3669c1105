/*
 * A library loaded with dlopen by entry_plug_main after start-up: the
 * exported plug_run(n) calls the internal (static, .symtab only) plug_step
 * for 1..n and returns the sum.
 */
static __attribute__((noinline, noclone)) int plug_step(int i)
{
	return i * i + 2;
}

int plug_run(int n)
{
	int s = 0;

	for (int i = 1; i <= n; i++)
		s += plug_step(i);
	return s;
}
