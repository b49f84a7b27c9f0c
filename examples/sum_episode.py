"""A custom episode for rl-batch-demo: check one sum, reward 1.0 if right, else 0.0.

Run it:   python3 rl-batch-demo.py run --backend local --episode examples/sum_episode.py \
              --tasks examples/sum_tasks.jsonl --output sums-local
Protocol: JSON lines on stdout; exactly one "ready" and one "reward" event, each with
"at" (time.time()) and "episode_id" ($EPISODE_ID); "reward" is a number; any other field
is kept in results.json. $TASK_FILE names this episode's task (a JSON file).
"""
import json
import os
import time

started_at = time.time()


def emit(event, **fields):
    print(json.dumps(dict(event=event, at=time.time(), episode_id=os.environ["EPISODE_ID"], **fields)), flush=True)


with open(os.environ["TASK_FILE"]) as task_file:
    task = json.load(task_file)
emit("ready", started_at=started_at)
answer = task["a"] + task["b"]  # a real episode would call a model and run tools here
emit("reward", reward=1.0 if answer == task["expected"] else 0.0, task_id=task["id"], answer=answer)
