"""fedjax_het.runtime.resources.release_freed_host_memory: freed C heap pages go back to the system."""

import ctypes
import platform

import pytest

from fedjax_het.runtime import resources

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's (Linux)")


def test_freed_heap_pages_leave_the_resident_set():
  libc = ctypes.CDLL(None)
  libc.malloc.restype = ctypes.c_void_p
  libc.malloc.argtypes = [ctypes.c_size_t]
  libc.free.argtypes = [ctypes.c_void_p]
  block, count = 64 * 1024, 2048  # 128 MiB in blocks below glibc's mmap threshold: the heap
  resources.release_freed_host_memory()
  blocks = [libc.malloc(block) for _ in range(count)]
  assert all(blocks)
  for address in blocks:
    ctypes.memset(address, 1, block)  # touched: resident
  before = resources.resident_bytes()
  # Every other block is freed: the live ones between keep glibc's free() from returning the
  # freed ones (no free chunk reaches the top of the heap).
  for address in blocks[::2]:
    libc.free(address)
  freed = count // 2 * block
  freed_but_kept = resources.resident_bytes()
  released = resources.release_freed_host_memory()
  after = resources.resident_bytes()
  for address in blocks[1::2]:
    libc.free(address)
  assert freed_but_kept > before - freed // 2  # glibc kept most of the freed pages
  assert released is not None and released >= freed // 2
  assert after <= freed_but_kept - freed // 2

def test_resident_bytes_reads_the_process():
  resident = resources.resident_bytes()
  assert resident is not None and 10 * 2 ** 20 < resident < 2 ** 40
