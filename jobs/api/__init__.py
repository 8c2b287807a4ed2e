"""`freight serve`: OpenAI's Files and Batches API over freight jobs (docs/design/serve.md).

A batch is a freight job: its input an uploaded file, its output and error files what `freight
results --format openai` writes. Torch-free, like all of jobs/: the code that runs models reaches
the API only as the runner the `freight serve` command hands to `create_app`.
"""
