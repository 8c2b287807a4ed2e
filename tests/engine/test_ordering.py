"""Batch-aware ordering: prefix groups stay together, groups run longest generation first."""

from worker.engine.ordering import batch_order, prefix_order

BS = 4


def test_prefix_order_is_a_depth_first_walk_of_the_trie() -> None:
    prompts = [[5, 1], [1, 2, 3], [1, 2], [5], [1, 2, 3]]
    assert prefix_order(prompts) == [2, 1, 4, 3, 0]


def test_groups_sharing_a_first_block_stay_together_in_trie_order() -> None:
    shared = [7, 7, 7, 7]
    prompts = [
        shared + [3],  # 0: group A
        [9, 9, 9, 9, 1],  # 1: alone
        shared + [1],  # 2: group A
        [2, 2],  # 3: shorter than a block: alone
        shared + [2, 5],  # 4: group A
    ]
    max_tokens = [5, 50, 100, 8, 1]
    order = batch_order(prompts, max_tokens, BS)
    # group A (max 100) first, in trie order 2, 4, 0; then the 50; then the 8
    assert order == [2, 4, 0, 1, 3]


def test_independent_prompts_run_longest_generation_first_and_ties_keep_trie_order() -> None:
    prompts = [[4, 0, 0, 0, 1], [1, 0, 0, 0, 1], [3, 0, 0, 0, 1], [2, 0, 0, 0, 1]]
    assert batch_order(prompts, [16, 16, 128, 16], BS) == [2, 1, 3, 0]
    assert sorted(batch_order(prompts, [1, 2, 3, 4], BS)) == [0, 1, 2, 3]  # a permutation
    assert batch_order([], [], BS) == []
