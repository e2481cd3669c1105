# lockshim - see README.md. Plain GNU make; respects CC, CFLAGS, LDFLAGS,
# PREFIX and DESTDIR. `make SANITIZER=address,undefined BUILD=build/asan`
# builds an instrumented copy (`make asan` does exactly that).

CC ?= cc
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
BINDIR ?= $(PREFIX)/bin
DOCDIR ?= $(PREFIX)/share/doc/lockshim
MANDIR ?= $(PREFIX)/share/man
BUILD ?= build
ARCH ?= $(shell uname -m)
include arch/$(ARCH)/arch.mk
PYTEST ?= /usr/bin/python3 -m pytest
VERSION := 0.1.0
# The shim's implicit config and the system-wide preload list are always
# these, whatever PREFIX: only DESTDIR moves them.
ETC_CONFIG := /etc/lockshim/lockshim.cfg
PRELOAD := /etc/ld.so.preload
# `make deb`: its own build, with the package's paths compiled in.
DEB_BUILD ?= build/deb
DEB_LIBDIR := /usr/lib/x86_64-linux-gnu/lockshim
DEB_MAINTAINER ?= lockshim developers <dev@lockshim.invalid>
DEB := build/lockshim_$(VERSION)_amd64.deb

WARN := -Wall -Wextra -Werror -Wstrict-prototypes -Wwrite-strings
OPT ?= -O2 -g
SAN := $(if $(SANITIZER),-fsanitize=$(SANITIZER) -fno-omit-frame-pointer)
BASE_CFLAGS := $(OPT) $(WARN) $(SAN) -D_GNU_SOURCE -MMD -MP \
	-iquote shim -iquote backend -iquote common -iquote arch -iquote arch/$(ARCH) \
	-DLOCKSHIM_VERSION='"$(VERSION)"' -DLOCKSHIM_LIBDIR='"$(LIBDIR)"'
SHIM_CFLAGS := $(BASE_CFLAGS) -fPIC -fvisibility=hidden -fexceptions \
	-ftls-model=initial-exec $(CFLAGS)

# libconfig, hiredis, capstone (the instruction decoder of entry patching)
# and mbedTLS (redis.tls) are linked statically with hidden symbols, so the
# shim needs only libc6 and libgcc-s1 at run time (an image without
# libconfig9 loads it), and neither the shim nor a program linking another
# copy (or another TLS library) can see or bind the other's. Debian's
# libconfig.a is not PIC: its scanner's stdin/stdout/stderr references are
# renamed to the shim's own variables (shim/staticlib.c) in a copy of the
# archive, which then links into a shared object without text relocations
# (-z text proves it). The CLI links the archives as they are.
# Of capstone, the shim links the core and this architecture's decoder
# only (arch/$(ARCH)/arch.mk, scripts/capstone-arch.sh): every
# architecture's tables (M68K's alone a megabyte of pointers) were relocated
# at every start of every program under the shim. -z pack-relative-relocs
# (DT_RELR, glibc 2.36) applies the relocations left from a bitmap. The archives'
# paths are asked of the compiler when the link runs (`=`, not `:=`),
# after the dependency check; `-z defs` makes any unresolved symbol a link
# error.
HIREDIS_A = $(shell $(CC) -print-file-name=libhiredis.a)
CAPSTONE_A = $(shell $(CC) -print-file-name=libcapstone.a)
LIBCONFIG_A = $(shell $(CC) -print-file-name=libconfig.a)
MBEDTLS_A = $(foreach l,mbedtls mbedx509 mbedcrypto,$(shell $(CC) -print-file-name=lib$(l).a))
SHIM_LIBS = $(HIREDIS_A) $(BUILD)/libcapstone-arch.a $(MBEDTLS_A) $(BUILD)/libconfig-shim.a -lpthread -ldl

# The folders are the architecture (doc/design.md): shim/ is the preload
# library proper, backend/ speaks to lock servers, common/ is what both
# products link, arch/$(ARCH)/ is one architecture, cli/ is the command.
# Object lists come from the folders, so a new file needs no edit here.
# `lockshim lock` takes its lock with the shim's own machinery: the lock
# state, the renewal thread and the counts (CLI_SHARED).
COMMON_SRC := $(wildcard common/*.c backend/*.c)
SHIM_SRC := $(wildcard shim/*.c) $(COMMON_SRC) $(wildcard arch/$(ARCH)/*.c arch/$(ARCH)/*.S)
CLI_SHARED := shim/lock.c shim/renew.c shim/guard.c shim/count.c
CLI_SRC := $(wildcard cli/*.c) $(CLI_SHARED) $(COMMON_SRC)
SHIM_OBJ := $(patsubst %,$(BUILD)/shim/%.o,$(basename $(SHIM_SRC)))
CLI_OBJ := $(patsubst %,$(BUILD)/cli/%.o,$(basename $(CLI_SRC)))
UNIT := config key keyname lock log metrics owner sha1 symhash
UNIT_BIN := $(UNIT:%=$(BUILD)/tests/test_%)
# The unit tests link the parser with the redis backend's settings and the
# CLI's description of them (not the backends, nor hiredis).
UNIT_OBJ := $(addprefix $(BUILD)/shim/,shim/guard.o common/conf.o common/conf_field.o \
	common/key.o common/keyname.o common/log.o shim/lock.o shim/renew.o common/sha1.o \
	common/owner.o common/fdown.o backend/backend_redis_conf.o backend/backend_tls_conf.o \
	cli/settings.o shim/symhash.o shim/count.o common/metrics.o)

# The man pages: doc/<page>.scd, turned into man(7) by scdoc.
MAN := $(BUILD)/man/lockshim.1 $(BUILD)/man/lockshim.cfg.5

# Backends built as modules (doc/design.md, backend/backend_module.h): each
# is backend/NAME/*.c, linked into $(BUILD)/liblockshim-NAME.so with its
# client library (MOD_LIBS_NAME), exporting one symbol (backend/NAME/NAME.map).
# The shim dlopens it only when the config selects that backend. A module
# may also link self-contained files of common/ (MOD_COMMON_NAME: no core
# state, hidden like the rest).
MODULES := postgres zookeeper etcd
MOD_LIBS_postgres := -lpq
MOD_CFLAGS_postgres := -I$(shell pg_config --includedir 2>/dev/null || echo /usr/include/postgresql)
MOD_LIBS_zookeeper := -lzookeeper_mt
MOD_CFLAGS_zookeeper := -I/usr/include/zookeeper -DTHREADED
MOD_COMMON_zookeeper := common/sha1.c common/keyname.c
MOD_LIBS_etcd := -lcurl -ljson-c
MOD_SO := $(MODULES:%=$(BUILD)/liblockshim-%.so)

all: $(BUILD)/liblockshim.so $(BUILD)/lockshim $(MOD_SO) $(MAN)

# cli/settings.o is built for the unit tests alone: not an intermediate file.
.SECONDARY: $(UNIT_OBJ)

$(BUILD)/liblockshim.so: $(SHIM_OBJ) shim/shim.map $(BUILD)/libconfig-shim.a $(BUILD)/libcapstone-arch.a
	$(CC) -shared $(SAN) -o $@ $(SHIM_OBJ) -Wl,--version-script=shim/shim.map \
		-Wl,--exclude-libs,ALL -Wl,-z,defs,-z,relro,-z,now,-z,noexecstack,-z,text \
		-Wl,-z,pack-relative-relocs \
		$(LDFLAGS) $(SHIM_LIBS)

# A module: its own folder's objects, libc and its client library only (-z
# defs: nothing of the core is reached by name).
define MODULE_RULE
$(BUILD)/liblockshim-$(1).so: $(patsubst %,$(BUILD)/mod/%.o,$(basename $(wildcard backend/$(1)/*.c) $(MOD_COMMON_$(1)))) backend/$(1)/$(1).map
	$$(CC) -shared $$(SAN) -o $$@ $$(filter %.o,$$^) -Wl,--version-script=backend/$(1)/$(1).map \
		-Wl,-z,defs,-z,relro,-z,now,-z,noexecstack,-z,text $$(LDFLAGS) $$(MOD_LIBS_$(1))
endef
$(foreach m,$(MODULES),$(eval $(call MODULE_RULE,$(m))))

$(BUILD)/mod/backend/%.o: backend/%.c | $(BUILD)/shim
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) $(MOD_CFLAGS_$(firstword $(subst /, ,$*))) -c $< -o $@

$(BUILD)/mod/common/%.o: common/%.c | $(BUILD)/shim
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(BUILD)/lockshim: $(CLI_OBJ)
	$(CC) $(SAN) -o $@ $(CLI_OBJ) -Wl,-z,relro,-z,now $(LDFLAGS) $(HIREDIS_A) $(LIBCONFIG_A) $(MBEDTLS_A) -lpthread

$(BUILD)/libconfig-shim.a: | $(BUILD)/shim
	rm -rf $@.d && mkdir -p $@.d && cd $@.d && ar x $(LIBCONFIG_A)
	for o in $@.d/*.o; do objcopy --redefine-sym stdin=staticlib_stdin \
		--redefine-sym stdout=staticlib_stdout --redefine-sym stderr=staticlib_stderr $$o || exit 1; done
	rm -f $@ && ar rcs $@ $@.d/*.o && rm -rf $@.d

$(BUILD)/libcapstone-arch.a: scripts/capstone-arch.sh arch/$(ARCH)/arch.mk | $(BUILD)/shim
	scripts/capstone-arch.sh $(CAPSTONE_A) $(CAPSTONE_ARCH) $@ $(CC) $(SHIM_CFLAGS)

$(BUILD)/shim/%.o: %.c | $(BUILD)/shim
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(BUILD)/shim/%.o: %.S | $(BUILD)/shim
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(BUILD)/cli/%.o: %.c | $(BUILD)/cli
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/man/%: doc/%.scd | $(BUILD)/man
	scdoc < $< > $@.tmp && mv $@.tmp $@

$(BUILD)/tests/test_%: tests/unit/test_%.c $(UNIT_OBJ) | $(BUILD)/tests
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests/unit -iquote cli -o $@ $< $(UNIT_OBJ) $(LDFLAGS) \
		-lconfig -lpthread

# Every build directory waits for the check of the build dependencies, which
# names the missing Debian packages and the command installing them.
$(BUILD)/shim $(BUILD)/cli $(BUILD)/tests $(BUILD)/man: build-deps
	@mkdir -p $@

build-deps:
	@scripts/install-deps.sh --check --build

deps:
	scripts/install-deps.sh

unit: $(UNIT_BIN)
	@for t in $(UNIT_BIN); do $$t || exit 1; done

# Targets that install packages first build in a second make, which reads
# this file again once the packages are there.
test: deps
	$(MAKE) all unit
	$(PYTEST) -q tests/integration

asan:
	$(MAKE) BUILD=build/asan SANITIZER=address,undefined all unit

test-asan: deps
	$(MAKE) asan
	LOCKSHIM_BUILD=build/asan LOCKSHIM_TEST_ASAN=1 $(PYTEST) -q tests/integration

# ThreadSanitizer: the shim, the CLI and the unit tests built in build/tsan,
# then the integration tests whose programs run several threads under the
# shim (about 5 minutes on 2 cores). Any report fails the test that caused
# it (support/util.py sends reports to files, conftest.py reads them).
TSAN_TESTS := exclusion identity lease linger release fork wakeup stranded policies real_programs \
	redlock entry interposition abi cluster sentinel tls_topologies lock_cmd metrics sets multikey postgres \
	zookeeper etcd modules

test-tsan: deps
	$(MAKE) BUILD=build/tsan SANITIZER=thread all unit
	rm -rf build/tsan/tsan-reports.*
	LOCKSHIM_BUILD=build/tsan LOCKSHIM_TEST_TSAN=1 $(PYTEST) -q \
		$(TSAN_TESTS:%=tests/integration/test_%.py)

# The timing-sensitive tests (marked `timing`: a time bound or a forced
# race) RUNS times in a row, stopping at the first failure; the -asan
# variant on the ASan build.
RUNS ?= 20
REPEAT = for i in $$(seq $(RUNS)); do echo "test-repeat: run $$i of $(RUNS)"; \
	$(1) $(PYTEST) -q -x -m timing tests/integration || exit 1; done

test-repeat: deps
	$(MAKE) all unit
	@$(call REPEAT,)

test-repeat-asan: deps
	$(MAKE) asan
	@$(call REPEAT,LOCKSHIM_BUILD=build/asan LOCKSHIM_TEST_ASAN=1)

bench:
	scripts/install-deps.sh --bench
	$(MAKE) all
	/usr/bin/python3 bench/bench.py --make --build $(BUILD) $(if $(BASELINE),--baseline $(BASELINE))

demo: deps
	$(MAKE) all
	examples/demo.sh $(BUILD)

# The system-wide config is installed only where none is: never overwritten.
install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(DOCDIR) \
		$(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(dir $(ETC_CONFIG))
	install -m 0755 $(BUILD)/liblockshim.so $(DESTDIR)$(LIBDIR)/liblockshim.so
	for m in $(MODULES); do install -m 0755 $(BUILD)/liblockshim-$$m.so \
		$(DESTDIR)$(LIBDIR)/liblockshim-$$m.so || exit 1; done
	install -m 0755 $(BUILD)/lockshim $(DESTDIR)$(BINDIR)/lockshim
	install -m 0644 config/lockshim.cfg README.md $(DESTDIR)$(DOCDIR)/
	install -m 0644 $(BUILD)/man/lockshim.1 $(DESTDIR)$(MANDIR)/man1/lockshim.1
	install -m 0644 $(BUILD)/man/lockshim.cfg.5 $(DESTDIR)$(MANDIR)/man5/lockshim.cfg.5
	@if [ -e "$(DESTDIR)$(ETC_CONFIG)" ] || [ -L "$(DESTDIR)$(ETC_CONFIG)" ]; then \
		echo "lockshim: kept $(DESTDIR)$(ETC_CONFIG) as it is"; \
	else \
		echo "install -m 0644 config/lockshim.etc.cfg $(DESTDIR)$(ETC_CONFIG)"; \
		install -m 0644 config/lockshim.etc.cfg "$(DESTDIR)$(ETC_CONFIG)"; \
	fi

# The preload line `lockshim enable` added goes first (the shim is still
# there for the programs that start meanwhile); the config stays.
uninstall:
	@. ./packaging/unpreload.sh && \
		lockshim_unpreload "$(DESTDIR)$(PRELOAD)" "$(LIBDIR)/liblockshim.so"
	rm -f $(DESTDIR)$(LIBDIR)/liblockshim.so $(DESTDIR)$(BINDIR)/lockshim
	rm -f $(MODULES:%=$(DESTDIR)$(LIBDIR)/liblockshim-%.so)
	rm -f $(DESTDIR)$(MANDIR)/man1/lockshim.1 $(DESTDIR)$(MANDIR)/man5/lockshim.cfg.5
	rm -rf $(DESTDIR)$(DOCDIR)
	@if [ -e "$(DESTDIR)$(ETC_CONFIG)" ]; then \
		echo "lockshim: left $(DESTDIR)$(ETC_CONFIG) (your config: remove it by hand if unwanted)"; \
	fi

# build/lockshim_<version>_amd64.deb: packaging/build-deb.sh stages and
# builds it from a clean build of its own (no object or link of an older
# Makefile gets into a package).
deb:
	rm -rf $(DEB_BUILD)
	$(MAKE) BUILD=$(DEB_BUILD) PREFIX=/usr LIBDIR=$(DEB_LIBDIR) all
	packaging/build-deb.sh $(DEB_BUILD) $(VERSION) $(DEB) "$(DEB_MAINTAINER)"

clean:
	rm -rf build

.PHONY: all build-deps deps unit test asan test-asan test-tsan test-repeat test-repeat-asan bench demo install uninstall deb clean

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
