"""LoRA adapters chosen per row and batched together: one base forward per step, plus each wrapped
projection's low-rank product for the adapters its tokens use (docs/design/lora.md).

    adapter   LoraAdapter: a PEFT folder loaded into host memory, checked against the base
    stacks    LoraStacks: the resident adapters' factors on the device, one stack per projection
    slots     LoraSlots: which adapters are resident (max_loras), swapped in least-recently-used first
    step      LoraStep: the adapter slot of each token of the step being run, on the device
    token_slots  step_slots: those slots from the scheduled step and the batch rows
    linear    LoraLinear: a projection plus the batched LoRA product
    manager   LoraManager: the registry, and the wrapping of the model's projections
"""

from worker.engine.lora.manager import LoraManager

__all__ = ["LoraManager"]
