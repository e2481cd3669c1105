// Calls may_throw(1), catches, reports, then waits for a line on stdin.
#include <cstdio>
#include <stdexcept>

extern "C" int may_throw(int x);

int main()
{
	char line[16];

	try {
		may_throw(1);
		std::puts("no exception");
	} catch (const std::runtime_error &e) {
		std::printf("caught %s\n", e.what());
	}
	std::printf("again %d\n", may_throw(0));
	std::fflush(stdout);
	if (!std::fgets(line, sizeof line, stdin))
		return 4;
	return 0;
}
