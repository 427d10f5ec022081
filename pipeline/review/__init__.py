"""make review: a local web page over one model's artifacts for the people who decide which variant
ships: the tradeoff, the items where a variant and bf16 disagree, and two variants answering one prompt.

    python -m pipeline.review artifacts/<model> [--port 7860] [--host 127.0.0.1] [--chat bf16 gptq-w4a16]
    REVIEW_USER=... REVIEW_PASSWORD=... python -m pipeline.review artifacts/<model> --host 0.0.0.0

Tabs:
  Report         report.json's decision, every variant's verdict, the plots of make report (no model runs)
  Disagreements  the items of a suite that bf16 and a variant score differently (eval/samples_<suite>.jsonl
                 of make eval), bf16 right / variant wrong first: the prompt, both outputs (think block
                 folded), extracted answers and gold; filters for suite, variant, figure and truncation
  Chat           one prompt to two variants, each behind vLLM's OpenAI server, streamed side by side with
                 time to first token, tokens/s and token counts; sampling as the published serve.yaml says
The page reads what the stages wrote and writes nothing under OUT. Its two vLLM servers start with it
(logs in a temporary folder) and stop when it exits (Ctrl-C or SIGTERM; Linux kills them if it is
killed). Gradio's request queue answers one chat at a time, so the figures under an answer are those of
one request, not of several users' requests sharing the engine. Runs in the serve environment.

Access: the page listens on 127.0.0.1 unless --host says otherwise; any other address (0.0.0.0, a LAN
address) is refused unless REVIEW_USER and REVIEW_PASSWORD are set in the environment, and then the
page and every one of its API routes ask for that login (Gradio's auth); set on 127.0.0.1 they are
asked for there too. Each chat server takes the stages' random API key (pipeline/serving.py: stage_api_key),
never the user's VLLM_API_KEY, and listens on 127.0.0.1.

Modules: disagreements (data) and render (HTML) of the Disagreements tab, report_tab, chat, page (the
Gradio page), access (login and address checks), __main__ (the command line).
"""
