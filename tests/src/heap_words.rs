//! Little-endian u64 words of a GPU PE's heap, for the GPU checks and
//! benchmarks (`cpnet-gpu-check`, `gpu_on_stream`, `gpu_on_stream_bench`):
//! one conversion each way and one read, instead of a copy per file.

use anyhow::Result;
use cpnet::GpuPe;
use cpnet::device::cpu::SymAddr;

/// `b` as little-endian u64 words (a trailing partial word is dropped).
pub fn bytes_u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// `words` as little-endian bytes.
pub fn u64s_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `n` little-endian u64 words of the local heap at `a`.
///
/// # Errors
/// The heap read's (a range outside the heap, CUDA).
pub fn read_u64s(pe: &GpuPe, a: SymAddr, n: usize) -> Result<Vec<u64>> {
    let mut b = vec![0u8; 8 * n];
    pe.read_heap(a, &mut b)?;
    Ok(bytes_u64s(&b))
}
