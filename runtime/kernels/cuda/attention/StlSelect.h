//===- StlSelect.h - libstdc++'s nth_element / sort / partial_sort, portable -*- C++ -*-===//
//
// The CPU's dsa_indexer selects like torch.topk on the CPU: std::nth_element
// then std::sort of the leading k-1 entries, or std::partial_sort when
// k*64 <= n (cpu/attention/DsaIndexer.cpp). Ties are frequent (a key whose
// ReLU terms all vanish scores exactly 0), and which tied key is picked
// depends on the algorithm's exact sequence of comparisons and moves. This
// is a line-by-line port of libstdc++ 12's (bits/stl_algo.h, stl_heap.h)
// __introselect, __introsort_loop, __final_insertion_sort, __heap_select and
// __sort_heap, usable from host and device code, so one GPU thread running
// it on a row reproduces the CPU's permutation exactly. The only change: the
// introsort recursion runs on an explicit stack (it processes disjoint
// ranges, so the order of processing changes nothing).
//
// StlSelectTest.cpp checks it against std:: on tie-heavy rows.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_STLSELECT_H_
#define RUNTIME_KERNELS_CUDA_ATTENTION_STLSELECT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define MOEC_HD __host__ __device__
#else
#define MOEC_HD
#endif

namespace moec::runtime::cuda::attention::stl {

/// (score, key position), as the CPU's std::pair<float, int64_t>.
struct Candidate {
  float score;
  int32_t key;
};

/// torch's ordering for largest=True: NaN first, then by value (the CPU's ranksHigher).
MOEC_HD inline bool ranksHigher(const Candidate &x, const Candidate &y) {
  bool xNan = x.score != x.score, yNan = y.score != y.score;
  return (xNan && !yNan) || x.score > y.score;
}

MOEC_HD inline void iterSwap(Candidate *a, Candidate *b) {
  Candidate t = *a;
  *a = *b;
  *b = t;
}

/// std::__lg for a positive long.
MOEC_HD inline int64_t floorLog2(int64_t n) {
  int64_t lg = 0;
  while (n > 1) {
    n >>= 1;
    ++lg;
  }
  return lg;
}

MOEC_HD inline void moveMedianToFirst(Candidate *result, Candidate *a, Candidate *b, Candidate *c) {
  if (ranksHigher(*a, *b)) {
    if (ranksHigher(*b, *c))
      iterSwap(result, b);
    else if (ranksHigher(*a, *c))
      iterSwap(result, c);
    else
      iterSwap(result, a);
  } else if (ranksHigher(*a, *c))
    iterSwap(result, a);
  else if (ranksHigher(*b, *c))
    iterSwap(result, c);
  else
    iterSwap(result, b);
}

MOEC_HD inline Candidate *unguardedPartition(Candidate *first, Candidate *last, Candidate *pivot) {
  while (true) {
    while (ranksHigher(*first, *pivot))
      ++first;
    --last;
    while (ranksHigher(*pivot, *last))
      --last;
    if (!(first < last))
      return first;
    iterSwap(first, last);
    ++first;
  }
}

MOEC_HD inline Candidate *unguardedPartitionPivot(Candidate *first, Candidate *last) {
  Candidate *mid = first + (last - first) / 2;
  moveMedianToFirst(first, first + 1, mid, last - 1);
  return unguardedPartition(first + 1, last, first);
}

MOEC_HD inline void unguardedLinearInsert(Candidate *last) {
  Candidate val = *last;
  Candidate *next = last;
  --next;
  while (ranksHigher(val, *next)) {
    *last = *next;
    last = next;
    --next;
  }
  *last = val;
}

MOEC_HD inline void insertionSort(Candidate *first, Candidate *last) {
  if (first == last)
    return;
  for (Candidate *i = first + 1; i != last; ++i) {
    if (ranksHigher(*i, *first)) {
      Candidate val = *i;
      for (Candidate *p = i; p != first; --p) // move_backward(first, i, i + 1)
        *p = *(p - 1);
      *first = val;
    } else
      unguardedLinearInsert(i);
  }
}

MOEC_HD inline void unguardedInsertionSort(Candidate *first, Candidate *last) {
  for (Candidate *i = first; i != last; ++i)
    unguardedLinearInsert(i);
}

constexpr int64_t kThreshold = 16; // libstdc++'s _S_threshold

MOEC_HD inline void finalInsertionSort(Candidate *first, Candidate *last) {
  if (last - first > kThreshold) {
    insertionSort(first, first + kThreshold);
    unguardedInsertionSort(first + kThreshold, last);
  } else
    insertionSort(first, last);
}

// Heaps (stl_heap.h); `comp(first + parent, value)` is ranksHigher(first[parent], value).
MOEC_HD inline void pushHeap(Candidate *first, int64_t holeIndex, int64_t topIndex,
                             Candidate value) {
  int64_t parent = (holeIndex - 1) / 2;
  while (holeIndex > topIndex && ranksHigher(first[parent], value)) {
    first[holeIndex] = first[parent];
    holeIndex = parent;
    parent = (holeIndex - 1) / 2;
  }
  first[holeIndex] = value;
}

MOEC_HD inline void adjustHeap(Candidate *first, int64_t holeIndex, int64_t len, Candidate value) {
  const int64_t topIndex = holeIndex;
  int64_t secondChild = holeIndex;
  while (secondChild < (len - 1) / 2) {
    secondChild = 2 * (secondChild + 1);
    if (ranksHigher(first[secondChild], first[secondChild - 1]))
      secondChild--;
    first[holeIndex] = first[secondChild];
    holeIndex = secondChild;
  }
  if ((len & 1) == 0 && secondChild == (len - 2) / 2) {
    secondChild = 2 * (secondChild + 1);
    first[holeIndex] = first[secondChild - 1];
    holeIndex = secondChild - 1;
  }
  pushHeap(first, holeIndex, topIndex, value);
}

MOEC_HD inline void makeHeap(Candidate *first, Candidate *last) {
  if (last - first < 2)
    return;
  const int64_t len = last - first;
  int64_t parent = (len - 2) / 2;
  while (true) {
    Candidate value = first[parent];
    adjustHeap(first, parent, len, value);
    if (parent == 0)
      return;
    parent--;
  }
}

MOEC_HD inline void popHeap(Candidate *first, Candidate *last, Candidate *result) {
  Candidate value = *result;
  *result = *first;
  adjustHeap(first, 0, last - first, value);
}

MOEC_HD inline void heapSelect(Candidate *first, Candidate *middle, Candidate *last) {
  makeHeap(first, middle);
  for (Candidate *i = middle; i < last; ++i)
    if (ranksHigher(*i, *first))
      popHeap(first, middle, i);
}

MOEC_HD inline void sortHeap(Candidate *first, Candidate *last) {
  while (last - first > 1) {
    --last;
    popHeap(first, last, last);
  }
}

/// std::partial_sort(first, middle, last, ranksHigher).
MOEC_HD inline void partialSort(Candidate *first, Candidate *middle, Candidate *last) {
  heapSelect(first, middle, last);
  sortHeap(first, middle);
}

/// std::__introsort_loop, its recursion on an explicit stack of offsets from
/// `first` (n < 2^31). The stack's depths strictly decrease from bottom to
/// top, so it never holds more than depthLimit + 1 <= 63 ranges.
MOEC_HD inline void introsortLoop(Candidate *first, Candidate *last, int64_t depthLimit) {
  struct Range {
    int32_t lo, hi, depth;
  };
  Range stack[64];
  int top = 0;
  stack[top++] = {0, static_cast<int32_t>(last - first), static_cast<int32_t>(depthLimit)};
  while (top > 0) {
    Range r = stack[--top];
    Candidate *lo = first + r.lo, *hi = first + r.hi;
    int32_t depth = r.depth;
    while (hi - lo > kThreshold) {
      if (depth == 0) {
        partialSort(lo, hi, hi);
        break;
      }
      --depth;
      Candidate *cut = unguardedPartitionPivot(lo, hi);
      // std recurses into [cut, hi) first, then loops on [lo, cut): disjoint ranges.
      stack[top++] = {static_cast<int32_t>(cut - first), static_cast<int32_t>(hi - first), depth};
      hi = cut;
    }
  }
}

/// std::sort(first, last, ranksHigher).
MOEC_HD inline void sort(Candidate *first, Candidate *last) {
  if (first != last) {
    introsortLoop(first, last, floorLog2(last - first) * 2);
    finalInsertionSort(first, last);
  }
}

/// std::nth_element(first, nth, last, ranksHigher).
MOEC_HD inline void nthElement(Candidate *first, Candidate *nth, Candidate *last) {
  if (first == last || nth == last)
    return;
  int64_t depthLimit = floorLog2(last - first) * 2;
  while (last - first > 3) {
    if (depthLimit == 0) {
      heapSelect(first, nth + 1, last);
      iterSwap(first, nth); // place the nth largest element in its final position
      return;
    }
    --depthLimit;
    Candidate *cut = unguardedPartitionPivot(first, last);
    if (cut <= nth)
      first = cut;
    else
      last = cut;
  }
  insertionSort(first, last);
}

/// The CPU's selectTopK: the first k of row[0, n) become the top k in torch.topk's order.
MOEC_HD inline void selectTopK(Candidate *row, int64_t n, int64_t k) {
  if (k * 64 <= n) {
    partialSort(row, row + k, row + n);
    return;
  }
  nthElement(row, row + k - 1, row + n);
  sort(row, row + k - 1);
}

} // namespace moec::runtime::cuda::attention::stl

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_STLSELECT_H_
