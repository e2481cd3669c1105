// A C++ member function defined and called in this executable:
// Account::post (_ZN7Account4postEi) throws when the balance would go below
// zero. main catches the exception, posts again, reports, then waits for a
// line on stdin (so the test can look at Redis while the program lives).
#include <cstdio>
#include <stdexcept>

struct Account {
	int balance;
	int post(int amount);
};

__attribute__((noinline, noclone)) int Account::post(int amount)
{
	if (balance + amount < 0)
		throw std::runtime_error("overdrawn");
	balance += amount;
	return balance;
}

int main()
{
	Account a{10};
	char line[16];

	try {
		a.post(-20);
		std::puts("no exception");
	} catch (const std::runtime_error &e) {
		std::printf("caught %s\n", e.what());
	}
	std::printf("again %d\n", a.post(5));
	std::fflush(stdout);
	if (!std::fgets(line, sizeof line, stdin))
		return 4;
	return 0;
}
