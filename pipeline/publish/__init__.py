"""make publish / make verify-published: the variant the policy chose, as one folder a deployment pulls
and serves as is.

    python -m pipeline.publish publish artifacts/<model> [--out artifacts/published] [--force] [--registry URL]
    python -m pipeline.publish verify artifacts/published/<model>-<variant> [--files-only] [--no-load]

`publish` reads artifacts/<model>/report.json (written by `make report`: the policy's decision) and
writes artifacts/published/<model>-<variant>/:
  the checkpoint files      as `make quantize` wrote them (checked against its manifest first)
  build-manifest.json       that manifest: recipe, calibration hash, versions, commit
  README.md                 a Hugging Face model card (YAML metadata, how it was made, results, the choice)
  serve.yaml                for `vllm serve --config serve.yaml`: the config bench measured the highest
                            capacity at the SLO with, else memory settings from the policy's `deployment`
  docker-compose.yml        the vLLM OpenAI image at the vLLM version that measured the variant, the
                            folder mounted read-only, /health checked
  k8s.yaml                  Deployment (readiness, liveness and start-up probes) + Service
  SHA256SUMS                `sha256sum -c SHA256SUMS` verifies a pull without this project
  manifest.json             the sha256 of every other file, and the capacity the folder states
Nothing qualified: nothing is written (exit 1). Publishing is immutable: an existing folder with other
content is refused unless --force; the same content again is a no-op. Written in a staging folder and
renamed into place when complete. With --registry, the folder is uploaded too (s3:// with deployment
files that pull it, or hf://).

`verify` checks every file against manifest.json, then (unless --files-only) proves the folder can be
served as its files say: with VLLM_API_KEY from the environment, as docker-compose.yml and k8s.yaml
take it (unset or empty: a one-line error, as they refuse to start then), through k8s.yaml's container
command (which refuses to start with an empty key: checked first), vLLM's server from serve.yaml on
127.0.0.1 answers /health, refuses a request without the API key (401), generates non-empty text for
one chat completion, and (unless --no-load) holds the SLO at the capacity the folder states, under a
short `vllm bench serve` run. It does not judge whether the answer is right: accuracy is what
`make eval` measured.

The modules: serve_yaml (serve.yaml, replicas; its memory sizing is pipeline/gpu_memory.py's), deploy_files
(compose, k8s, the image), model_card, publishing (the folder), verify and load_test (verify-published),
__main__ (the command line); and REGISTRY's: upload (the folder to REGISTRY), registry (an S3 store, boto3),
hub (a Hugging Face repository), pull_deploy (the deployment files that pull from an S3 store), puller/ (the
deployments' puller: Python's standard library only, a folder shipped beside those files).
"""
