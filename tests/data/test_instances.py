"""Instances as create_pretraining_data.py (segment structure, NSP, truncation) and RoBERTa's FULL-SENTENCES."""
import numpy as np
import pytest

from jbert.data import instances

CLS, SEP, PAD = 2, 3, 0


def make_documents(num_docs: int, sentences: int, length: int) -> list[list[list[int]]]:
  """Every token is unique: document d, sentence s, token t -> 1000 + (d * sentences + s) * length + t."""
  return [[list(1000 + (d * sentences + s) * length + np.arange(length)) for s in range(sentences)]
          for d in range(num_docs)]


def owner(token: int, sentences: int, length: int) -> tuple[int, int]:
  """(document, sentence) of a token of `make_documents`."""
  flat = (token - 1000) // length
  return flat // sentences, flat % sentences


def is_contiguous(tokens: list[int]) -> bool:
  return bool(np.all(np.diff(tokens) == 1))


def test_truncate_seq_pair_longest_first_ties_off_b():
  rng = np.random.default_rng(0)
  expected = {(10, 3, 8): (5, 3), (4, 4, 6): (3, 3), (5, 4, 6): (3, 3), (2, 9, 7): (2, 5), (3, 3, 9): (3, 3)}
  for (la, lb, limit), (ea, eb) in expected.items():
    a, b = instances.truncate_seq_pair(list(range(la)), list(range(100, 100 + lb)), limit, rng)
    assert (len(a), len(b)) == (ea, eb)
    assert is_contiguous(a) and is_contiguous(b)


def test_truncation_takes_front_and_back_equally():
  rng = np.random.default_rng(1)
  fronts = [instances.truncate_seq_pair(list(range(20)), [100], 11, rng)[0][0] for _ in range(2000)]
  # 10 tokens cut from A; the number taken from the front is Binomial(10, 1/2).
  assert np.mean(fronts) == pytest.approx(5.0, abs=0.15)


def test_nsp_instances_follow_the_document():
  docs = make_documents(num_docs=6, sentences=12, length=5)
  found = []
  for d in range(len(docs)):
    found += [(d, *inst) for inst in instances.document_instances(docs, d, 64, 0.0,
                                                                  np.random.default_rng(d))]
  covered = set()
  for d, a, b, is_random in found:
    assert a and b and len(a) + len(b) <= 64 - 3
    assert {owner(t, 12, 5)[0] for t in a} == {d}
    b_docs = {owner(t, 12, 5)[0] for t in b}
    if is_random:
      assert b_docs != {d} and len(b_docs) == 1 and is_contiguous(b)
    else:
      assert b_docs == {d} and is_contiguous(a + b)  # B is A's actual continuation.
      covered |= {owner(t, 12, 5) for t in b}
    covered |= {owner(t, 12, 5) for t in a}
  # Sentences skipped by a random B are put back, so every sentence is used.
  assert covered == {(d, s) for d in range(6) for s in range(12)}


def test_nsp_is_half_random_with_long_documents():
  docs = make_documents(num_docs=300, sentences=60, length=6)
  labels = [inst[2] for d in range(len(docs))
            for inst in instances.document_instances(docs, d, 128, 0.0, np.random.default_rng(d))]
  assert len(labels) > 1200
  assert np.mean(labels) == pytest.approx(0.5, abs=0.04)


def test_one_sentence_document_gets_a_random_b():
  docs = [[[10, 11, 12]], [[20, 21], [22, 23]]]
  (a, b, is_random), = instances.document_instances(docs, 0, 16, 0.0, np.random.default_rng(0))
  assert (a, is_random) == ([10, 11, 12], 1)
  assert set(b) <= {20, 21, 22, 23} and b


def test_single_document_group_draws_from_itself():
  docs = [[[1, 2], [3, 4], [5, 6], [7, 8]]]
  found = instances.document_instances(docs, 0, 8, 0.0, np.random.default_rng(3))
  assert all(set(a + b) <= set(range(1, 9)) for a, b, _ in found)


def test_short_seq_prob_shortens_targets():
  docs = make_documents(num_docs=200, sentences=20, length=4)
  lengths = {p: [len(a) + len(b) for d in range(len(docs))
                 for a, b, _ in instances.document_instances(docs, d, 128, p, np.random.default_rng(d))]
             for p in (0.0, 1.0)}
  assert np.mean(lengths[1.0]) < 0.7 * np.mean(lengths[0.0])
  assert min(lengths[1.0]) >= 2


def test_full_sentences_pack_whole_sentences_across_documents():
  docs = [[list(1000 + 100 * d + 10 * s + np.arange(n)) for s, n in enumerate(lengths)]
          for d, lengths in enumerate([[3, 4], [5], [2, 2, 2], [9, 1], [25], [4]])]
  found = instances.full_sentences(docs, 16, 0.0, SEP, np.random.default_rng(0))
  assert all(b == [] and label == 0 for _, b, label in found)
  tokens = [[int(t) for t in a] for a, _, _ in found]
  assert tokens == [  # 14 tokens at most; [SEP] between documents; the 25-token sentence cut to 14
      [*range(1000, 1003), *range(1010, 1014), SEP, *range(1100, 1105)],
      [*range(1200, 1202), *range(1210, 1212), *range(1220, 1222)],  # a [SEP] and 9 more would make 16
      [*range(1300, 1309), 1310],
      tokens[3],
      [*range(1500, 1504)]]
  assert len(tokens[3]) == 14 and is_contiguous(tokens[3]) and 1400 <= tokens[3][0] <= 1411


def test_full_sentences_fill_sequences_where_document_instances_leave_them_short():
  docs = make_documents(num_docs=40, sentences=3, length=5)  # 15-token documents
  full = instances.full_sentences(docs, 64, 0.0, SEP, np.random.default_rng(0))
  assert np.mean([len(a) for a, _, _ in full[:-1]]) >= 55
  seen = [t for a, _, _ in full for t in a if t != SEP]
  assert seen == [t for d in docs for s in d for t in s]  # every token once, in order: nothing is lost


def test_same_generator_same_instances():
  docs = make_documents(num_docs=5, sentences=10, length=5)
  make = lambda seed: instances.document_instances(docs, 2, 40, 0.1, np.random.default_rng(seed))
  assert make(7) == make(7)
  assert make(7) != make(8)


def test_pack_layout():
  batch = instances.pack([([5, 6], [7, 8, 9], 1), ([5], [], 0)], 8, CLS, SEP, PAD)
  np.testing.assert_array_equal(batch["input_ids"],
                                [[CLS, 5, 6, SEP, 7, 8, 9, SEP], [CLS, 5, SEP, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch["token_type_ids"], [[0, 0, 0, 0, 1, 1, 1, 1], [0] * 8])
  np.testing.assert_array_equal(batch["attention_mask"], [[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch["next_sentence_labels"], [1, 0])
  assert all(v.dtype == np.int32 for v in batch.values())


def test_pack_of_nothing_has_shapes():
  batch = instances.pack([], 8, CLS, SEP, PAD)
  assert batch["input_ids"].shape == (0, 8) and batch["next_sentence_labels"].shape == (0,)
