"""What a LoRA adapter folder must say for freight to serve it over a base model, torch-free.

A PEFT LoRA adapter folder holds adapter_config.json and adapter_model.safetensors. The job check at
submit (jobs/adapter_check.py, reading the files' JSON and safetensors header only) and the engine
at load (worker/engine/lora/) both run these rules, so an adapter is refused before a job runs with
the words a worker would use, naming the adapter:

    config    LoraAdapterConfig: adapter_config.json's LoRA fields, the options freight refuses
    targets   the base model's modules a LoRA can wrap (q/k/v/o, gate/up/down), by Hugging Face name
    check     an adapter's tensors against its config and the base: shapes, ranks, missing, extra
"""
