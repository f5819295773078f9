/* util_stub.c - keeps the test helper library non-empty when tests/util has no sources. */
int ppn_test_util_stub;
