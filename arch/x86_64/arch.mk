# arch.mk - what the Makefile needs to know of this architecture.
# CAPSTONE_ARCH: the prefix of capstone's objects that decode it (the shim
# links capstone's core and these only: scripts/capstone-arch.sh).
CAPSTONE_ARCH := X86
