"""Runs a compiled Vertex AI PipelineJob here, task by task, the way Vertex's launcher runs it.

Test infrastructure, not a feature: the closest thing to Vertex that runs offline. For each task of
the job's root DAG, in dependency order:

- a container task runs its `command` and `args` from the compiled spec (the preCacheCheck hook
  first, when it has one), with `python` meaning this interpreter and the project checkout standing
  in for the image's working directory; `{{$}}` becomes the ExecutorInput JSON the launcher would
  build (input artifacts with their metadata, constant parameters, output URIs under the pipeline
  root, an output file) and the executor's ExecutorOutput file gives the outputs' final metadata;
- a resolver task answers its output artifact queries (the filter syntax Vertex ML Metadata takes:
  schema_title, state, name and metadata values joined by AND) from the artifacts of the runs so far,
  newest first, as Vertex does.

A task whose command fails fails the run: nothing downstream runs. The tasks see a GCE metadata server
(tests/fake_endpoints.py) that names the account the run executes as: the one the job was compiled for (as
`imagepipe submit` sends it), or `service_account` (a run started without it). Not modelled: Vertex's cache
(every task runs), machine types, Dataflow and Vertex Training (the default job uses neither).

Each task is a process of its own, as each is a container of its own on Vertex. A `python -m MODULE`
command is forked from a warm interpreter (tests/warm_interpreter.py) that has already imported
TFX's executor entry point, which every task imports first (with TensorFlow, Beam, TFT, TFDV and
TFMA behind it): 4-5 s of imports a task, about half of what the two compiled runs of the test cost.
The forked task then runs the module as `python -m` would (runpy, as __main__, with its argv); any
other command runs as a subprocess.
"""

import itertools
import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List, Optional

import yaml
from fake_endpoints import FakeService
from warm_interpreter import WarmInterpreter

from pipeline.cloud_config import IMAGE_PROJECT_DIR
from pipeline.config import PROJECT_DIR

STORE = "projects/proj-1/locations/europe-west4/metadataStores/default/artifacts"
TASK_SECONDS = 900
WARM_MODULE = "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"  # what every task imports first


def _task_env(metadata_host: str) -> dict:
    # The image's working directory is on the path; the metadata server is the run's own.
    return {**os.environ, "PYTHONPATH": PROJECT_DIR, "GCE_METADATA_HOST": metadata_host}


def _compiled_account(spec) -> str:
    """The service account compiled into the job's RunCheck task, or the default compute account."""
    check = spec["root"]["dag"]["tasks"].get("RunCheck", {}).get("inputs", {}).get("parameters", {})
    constant = check.get("service_account", {}).get("runtimeValue", {}).get("constantValue", {})
    return constant.get("stringValue") or "123-compute@developer.gserviceaccount.com"


class TaskFailed(Exception):
    def __init__(self, task: str, stderr: str):
        super().__init__(f"{task} failed: {stderr.strip().splitlines()[-1] if stderr.strip() else '(no output)'}")
        self.task, self.stderr = task, stderr


class OfflineVertex:
    """One ML Metadata store's worth of artifacts; run() executes one PipelineJob against it."""

    def __init__(self, workdir: str, interpreter: WarmInterpreter):
        """`interpreter`: a warm interpreter that has imported WARM_MODULE (the tests' shared one)."""
        self.workdir = workdir
        self.artifacts: List[Dict[str, Any]] = []  # every published artifact, oldest first
        self._interpreter = interpreter
        self._ids = itertools.count(1)
        self._runs = itertools.count(1)

    def run(
        self,
        job_path: str,
        paths: Dict[str, str],
        parameters: Optional[Dict[str, Any]] = None,
        service_account: Optional[str] = None,
    ) -> Dict[str, Dict[str, List[Dict]]]:
        """Runs every task of the job; `paths` maps the job's gs:// locations to local folders, `parameters`
        are values for its runtime parameters (as `--param` or Vertex's parameter_values give them),
        `service_account` the account the run executes as (default: the one compiled into the job).

        Returns {task: {output key: [artifact]}} for the tasks that ran; raises TaskFailed (with
        .outputs, what ran before it) when one fails.
        """
        text = open(job_path).read().replace(f'"{IMAGE_PROJECT_DIR}/', f'"{PROJECT_DIR}/')
        for remote, local in paths.items():
            text = text.replace(remote, local)
        job = json.loads(text)
        spec, run_dir = job["pipelineSpec"], os.path.join(self.workdir, f"job-{next(self._runs)}")
        # The job's runtime parameters: the values compiled into runtimeConfig, then those given.
        self._parameters = dict(job.get("runtimeConfig", {}).get("parameters", {}))
        declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        for name, value in (parameters or {}).items():
            assert name in declared, f"the job has no runtime parameter {name!r}"
            kind = declared[name].get("type") or declared[name].get("parameterType")
            self._parameters[name] = (
                {"intValue": str(value)}
                if "INT" in kind
                else {"doubleValue": value}
                if "DOUBLE" in kind
                else {"stringValue": str(value)}
            )
        outputs: Dict[str, Dict[str, List[Dict]]] = {}
        with FakeService(service_account=service_account or _compiled_account(spec)) as metadata:
            self._metadata_host = metadata.host_port
            return self._run_tasks(spec, run_dir, outputs)

    def _run_tasks(self, spec, run_dir, outputs) -> Dict[str, Dict[str, List[Dict]]]:
        for name, task in _in_dependency_order(spec["root"]["dag"]["tasks"]):
            component = spec["components"][task["componentRef"]["name"]]
            executor = spec["deploymentSpec"]["executors"][component["executorLabel"]]
            inputs = {
                key: outputs[source["taskOutputArtifact"]["producerTask"]].get(
                    source["taskOutputArtifact"]["outputArtifactKey"], []
                )
                for key, source in task.get("inputs", {}).get("artifacts", {}).items()
            }
            try:
                if "resolver" in executor:
                    outputs[name] = self._resolve(executor["resolver"]["outputArtifactQueries"], inputs)
                else:
                    outputs[name] = self._launch(
                        name, task, component, executor["container"], inputs, os.path.join(run_dir, name)
                    )
            except TaskFailed as failed:
                failed.outputs = outputs
                raise
        return outputs

    def _launch(self, name, task, component, container, inputs, task_dir) -> Dict[str, List[Dict]]:
        output_file = os.path.join(task_dir, "executor_output.json")
        declared = component.get("outputDefinitions", {}).get("artifacts", {})
        planned = {
            key: [
                {
                    "name": f"{STORE}/{next(self._ids)}",
                    "uri": os.path.join(task_dir, key),
                    "type": definition["artifactType"],
                    "metadata": {},
                }
            ]
            for key, definition in declared.items()
        }
        executor_input = json.dumps(
            {
                "inputs": {
                    "artifacts": {key: {"artifacts": arts} for key, arts in inputs.items()},
                    "parameters": {
                        key: value["runtimeValue"]["constantValue"]
                        if "runtimeValue" in value
                        else self._parameters[value["componentInputParameter"]]
                        for key, value in task.get("inputs", {}).get("parameters", {}).items()
                    },
                },
                "outputs": {
                    "artifacts": {key: {"artifacts": arts} for key, arts in planned.items()},
                    "outputFile": output_file,
                },
            }
        )
        os.makedirs(task_dir, exist_ok=True)
        hook = container.get("lifecycle", {}).get("preCacheCheck")
        for number, step in enumerate(([hook] if hook else []) + [container]):
            argv = [sys.executable if part == "python" else part for part in step["command"]] + [
                executor_input if part == "{{$}}" else part for part in step["args"]
            ]
            assert not any("{{" in part for part in argv), f"{name}: a placeholder this launcher does not fill"
            if argv[:2] == [sys.executable, "-m"]:
                logs = os.path.join(task_dir, f"step-{number}")
                env = _task_env(self._metadata_host)
                if self._interpreter.run_module(argv[2], argv[3:], logs, env=env, timeout=TASK_SECONDS):
                    with open(logs + ".stderr") as f:
                        raise TaskFailed(name, f.read())
                continue
            done = subprocess.run(
                argv,
                cwd=PROJECT_DIR,
                capture_output=True,
                text=True,
                timeout=TASK_SECONDS,
                env=_task_env(self._metadata_host),
            )
            if done.returncode:
                raise TaskFailed(name, done.stderr)
        written = json.load(open(output_file)).get("artifacts", {}) if os.path.exists(output_file) else {}
        for key, arts in planned.items():  # the executor's word on its outputs' metadata is final
            for art, final in zip(arts, written.get(key, {}).get("artifacts", [])):
                art["metadata"] = final.get("metadata", {})
            self.artifacts.extend(arts)
        return planned

    def _resolve(self, queries, inputs) -> Dict[str, List[Dict]]:
        placeholder = re.compile(r"\{\{\$\.inputs\.artifacts\['([^']+)'\]\.metadata\['([^']+)'\]\}\}")
        resolved = {}
        for key, query in queries.items():
            needed = [inputs[m.group(1)] for m in placeholder.finditer(query["filter"])]
            if not all(needed):  # an empty input (nothing blessed yet): nothing to look up
                resolved[key] = []
                continue
            text = placeholder.sub(lambda m: str(inputs[m.group(1)][0]["metadata"][m.group(2)]), query["filter"])
            resolved[key] = [a for a in reversed(self.artifacts) if _matches(a, text)][:1]  # the newest
        return resolved


def _in_dependency_order(tasks: Dict[str, Dict]) -> List:
    done, order = set(), []
    while len(order) < len(tasks):
        ready = [n for n in sorted(tasks) if n not in done and set(_upstream(tasks[n])) <= done]
        assert ready, "the job's DAG has a cycle"
        done.update(ready)
        order.extend((n, tasks[n]) for n in ready)
    return order


def _upstream(task) -> List[str]:
    producers = [s["taskOutputArtifact"]["producerTask"] for s in task.get("inputs", {}).get("artifacts", {}).values()]
    return task.get("dependentTasks", []) + producers


def _matches(artifact: Dict[str, Any], query: str) -> bool:
    """Vertex ML Metadata's filter syntax, the clauses TFX's resolvers compile to."""
    for clause in query.split(" AND "):
        field, value = (part.strip() for part in clause.split("=", 1))
        value = value.strip('"')
        if field == "schema_title":
            actual = _title(artifact["type"])
        elif field == "state":
            actual = "LIVE"  # only a task that succeeded publishes its outputs
        elif field == "name":
            actual = artifact["name"]
        elif field.startswith("metadata.") and field.endswith(".number_value"):
            actual, value = artifact["metadata"].get(field[len("metadata.") : -len(".number_value")]), float(value)
        else:
            raise AssertionError(f"a filter clause this launcher does not know: {clause}")
        if actual != value:
            return False
    return True


def _title(artifact_type: Dict[str, str]) -> Optional[str]:
    if "schemaTitle" in artifact_type:
        return artifact_type["schemaTitle"]
    return yaml.safe_load(artifact_type["instanceSchema"]).get("title")
