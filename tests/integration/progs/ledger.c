/* A legacy library: a read-modify-write of a counter file, with a window. */
#include <stdio.h>
#include <unistd.h>

#ifndef LEDGER_WINDOW_US
#define LEDGER_WINDOW_US 1000 /* between the read and the write */
#endif

int ledger_update(const char *path)
{
	long v = 0;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
		fclose(f);
	}
	usleep(LEDGER_WINDOW_US);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "%ld\n", v + 1);
	fclose(f);
	return (int)(v + 1);
}
