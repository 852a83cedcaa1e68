#!/usr/bin/env python3
"""clusters/k8s manifests: they parse and carry what the deployment needs (gang minAvailable, the
plugins that give ranks their addresses, restart on eviction, GPUs, RDMA, /dev/shm, the MIG
variant, the Kubeflow MPIJob); then every pod of each Volcano job is simulated as a local process
with exactly the environment Volcano's pytorch/svc/env plugins give it (their rules as in
volcano-sh/volcano pkg/controllers/job/plugins: pod name <job>-<task>-<i>, hostname = pod name,
subdomain = job, MASTER_ADDR = <job>-master-0.<job>, RANK master 0 / worker i+1, WORLD_SIZE =
master + worker replicas, VC_<TASK>_HOSTS, VC_<TASK>_NUM, VC_TASK_INDEX/VK_TASK_INDEX), its own
UTS namespace (the host name) and /etc/hosts (the headless service's DNS), and the pods must
bootstrap triax together. With TRAIN_GPT and MPIEXEC, the pods of the Volcano job also train
together (the CPU path's host communicator is then Gloo) and must print mpirun's losses.
Usage: k8s_test.py BOOTSTRAP_CHECK SOURCE_DIR [TRAIN_GPT MPIEXEC]"""
import re
import uuid
import os, shutil, socket, subprocess, sys, tempfile
try:
    import yaml
except ImportError:
    print("SKIP: PyYAML missing (Debian package python3-yaml)")
    sys.exit(77)

check, src = sys.argv[1], sys.argv[2]
train, mpiexec = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
k8s = os.path.join(src, "clusters", "k8s")
failures = []
def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)

def containers(task):
    return task["template"]["spec"]["containers"]
def limits(c):
    return c.get("resources", {}).get("limits", {})

def check_volcano(path, gpu_resource, rdma):
    job = yaml.safe_load(open(path))
    name = os.path.basename(path)
    spec = job["spec"]
    expect(job["apiVersion"] == "batch.volcano.sh/v1alpha1" and job["kind"] == "Job", f"{name}: a Volcano batch Job")
    expect(spec.get("schedulerName") == "volcano", f"{name}: scheduled by volcano")
    total = sum(t["replicas"] for t in spec["tasks"])
    expect(spec.get("minAvailable") == total, f"{name}: gang minAvailable {spec.get('minAvailable')} == all {total} pods")
    plugins = spec.get("plugins", {})
    expect("pytorch" in plugins and "svc" in plugins and "env" in plugins, f"{name}: pytorch, svc and env plugins")
    pol = {(p["event"], p["action"]) for p in spec.get("policies", [])}
    expect(("PodEvicted", "RestartJob") in pol, f"{name}: restart the job on pod eviction")
    tasks = {t["name"]: t for t in spec["tasks"]}
    expect(set(tasks) == {"master", "worker"} and tasks["master"]["replicas"] == 1, f"{name}: one master, workers")
    expect(any(p.get("event") == "TaskCompleted" and p.get("action") == "CompleteJob"
               for p in tasks["master"].get("policies", [])), f"{name}: the job completes with its master")
    for t in tasks.values():
        for c in containers(t):
            expect(gpu_resource in limits(c), f"{name}/{t['name']}: {gpu_resource} requested")
            if rdma:
                expect(any(k.startswith("rdma/") for k in limits(c)), f"{name}/{t['name']}: an RDMA device-plugin resource")
                expect("IPC_LOCK" in c.get("securityContext", {}).get("capabilities", {}).get("add", []),
                       f"{name}/{t['name']}: IPC_LOCK for RDMA registration")
            vols = {v["name"]: v for v in t["template"]["spec"].get("volumes", [])}
            shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            expect(len(shm) == 1 and vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
                   f"{name}/{t['name']}: /dev/shm is a memory emptyDir")
            expect(c.get("command", [""])[0] == "train_gpt", f"{name}/{t['name']}: runs train_gpt")
    return job

def downward(e, jname, uid):
    """A container env entry's value: literal, or the downward API's view of the pod's metadata
    (Volcano annotates each pod with its PodGroup, scheduling.k8s.io/group-name = <job>-<uid>)."""
    if "value" in e:
        return e["value"]
    path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
    annotations = {"scheduling.k8s.io/group-name": f"{jname}-{uid}", "volcano.sh/job-name": jname}
    m = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path)
    expect(m is not None and m.group(1) in annotations, f"{jname}: env {e['name']} from a known pod field ({path})")
    return annotations.get(m.group(1), "") if m else ""

def pod_envs(job, port):
    """The environment Volcano's pytorch, svc and env plugins give each pod (plus the container's own)."""
    jname = job["metadata"]["name"]
    uid = str(uuid.uuid4())  # the Job object's uid, one per submission
    spec = job["spec"]
    args = dict(a.lstrip("-").split("=", 1) for a in spec["plugins"]["pytorch"])
    master, worker = args.get("master", "master"), args.get("worker", "worker")
    world = sum(t["replicas"] for t in spec["tasks"] if t["name"] in (master, worker))
    hosts = {t["name"]: [f"{jname}-{t['name']}-{i}.{jname}" for i in range(t["replicas"])] for t in spec["tasks"]}
    pods = []
    for t in spec["tasks"]:
        for i in range(t["replicas"]):
            env = {e["name"]: downward(e, jname, uid) for e in containers(t)[0].get("env", [])}
            env.update({"MASTER_ADDR": f"{jname}-{master}-0.{jname}", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                        "RANK": str(0 if t["name"] == master else i + 1),
                        "VC_TASK_INDEX": str(i), "VK_TASK_INDEX": str(i)})
            for tn, hs in hosts.items():
                env[f"VC_{tn.upper()}_HOSTS"] = ",".join(hs)
                env[f"VC_{tn.upper()}_NUM"] = str(len(hs))
            pods.append((f"{jname}-{t['name']}-{i}", env))
    return pods, [h for hs in hosts.values() for h in hs]

def simulate(job, cmd=None):
    """Runs cmd (default: bootstrap_check) in every pod; returns rank 0's output."""
    jname = job["metadata"]["name"]
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    # The manifest's port (23456) is the pods' own; locally another test may hold it.
    pods, fqdns = pod_envs(job, port)
    tmp = tempfile.mkdtemp(prefix="triax-k8s-")
    try:
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for h in fqdns:
                f.write(f"127.0.0.1 {h} {h.split('.')[0]}\n")
        procs = []
        for pod, env in pods:
            full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", **env}
            cmd = ["unshare", "--mount", "--uts", "sh", "-c",
                   f'mount --bind "{hosts}" /etc/hosts && hostname "{pod}" && exec "$0" "$@"'] + (cmd or [check])
            procs.append((pod, env, subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        outs = {}
        for pod, env, p in procs:
            try:
                outs[pod] = (env, p.communicate(timeout=120)[0], p.returncode)
            except subprocess.TimeoutExpired:
                p.kill()
                outs[pod] = (env, p.communicate()[0], -9)
        for pod, (env, out, rc) in outs.items():
            expect(rc == 0, f"{jname}: pod {pod} (RANK {env['RANK']}) bootstrapped (rc {rc}){'' if rc == 0 else ': ' + out}")
        master_out = outs[f"{jname}-master-0"][1]
        print(master_out)
        if cmd:
            return master_out
        expect(f"launch env world {len(pods)}" in master_out, f"{jname}: rank 0 saw a world of {len(pods)} pods")
        for pod, (env, _, _) in outs.items():
            expect(f"rank {env['RANK']} {pod} " in master_out, f"{jname}: rank {env['RANK']} is pod {pod} (its own host name)")
    finally:
        shutil.rmtree(tmp)

if shutil.which("unshare") is None or os.geteuid() != 0:
    print("SKIP: simulating pods needs root and unshare (mount and UTS namespaces)")
    sys.exit(77)
full = check_volcano(os.path.join(k8s, "volcano-job.yaml"), "nvidia.com/gpu", rdma=True)
mig = check_volcano(os.path.join(k8s, "volcano-job-mig.yaml"), "nvidia.com/mig-1g.10gb", rdma=False)
mpi = yaml.safe_load(open(os.path.join(k8s, "mpijob.yaml")))
expect(mpi["apiVersion"] == "kubeflow.org/v2beta1" and mpi["kind"] == "MPIJob", "mpijob.yaml: a Kubeflow v2beta1 MPIJob")
specs = mpi["spec"]["mpiReplicaSpecs"]
launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
workers = specs["Worker"]
np_ = int(launcher["args"][launcher["args"].index("-np") + 1])
expect(np_ == workers["replicas"] * mpi["spec"]["slotsPerWorker"], f"mpijob.yaml: mpirun -np {np_} = workers x slotsPerWorker")
expect("train_gpt" in launcher["args"] and launcher["command"] == ["mpirun"], "mpijob.yaml: the launcher mpiruns train_gpt")
expect(limits(workers["template"]["spec"]["containers"][0]).get("nvidia.com/gpu") == mpi["spec"]["slotsPerWorker"],
       "mpijob.yaml: one GPU per slot")
expect(mpi["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == workers["replicas"] + 1,
       "mpijob.yaml: gang of launcher + workers")
tp_pp_dp = [int(launcher["args"][launcher["args"].index(f) + 1]) for f in ("--tp", "--pp", "--dp")]
expect(tp_pp_dp[0] * tp_pp_dp[1] * tp_pp_dp[2] == np_, f"mpijob.yaml: tp x pp x dp = {np_}")
a = containers(full["spec"]["tasks"][0])[0]["args"]
t = [int(a[a.index(f) + 1]) for f in ("--tp", "--pp", "--dp")]
g = full["spec"]["minAvailable"] * limits(containers(full["spec"]["tasks"][0])[0])["nvidia.com/gpu"]
expect(t[0] * t[1] * t[2] == g, f"volcano-job.yaml: tp x pp x dp = {g} GPUs")
for job in (full, mig):
    simulate(job)
if train:
    # The four pods of volcano-job.yaml train a small model as tp 2 x dp 2, the same as mpirun -np 4.
    args = ["--tp", "2", "--dp", "2", "--train-iters", "3", "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "4", "--seq-length", "32"]
    pods_out = simulate(full, [train] + args) or ""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ref = subprocess.run([mpiexec, "--oversubscribe", "-np", "4", train] + args, env=env, capture_output=True,
                         text=True, timeout=300)
    expect(ref.returncode == 0, "mpirun -np 4 train_gpt" + ("" if ref.returncode == 0 else f": {ref.stdout}{ref.stderr}"))
    loss = lambda out: [l[l.index("lm loss:"):].split("|")[0].strip() for l in out.splitlines() if "lm loss:" in l]
    expect(len(loss(pods_out)) == 3, f"the Volcano pods printed 3 losses: {loss(pods_out)}")
    expect(loss(pods_out) == loss(ref.stdout), f"pods' losses {loss(pods_out)} == mpirun's {loss(ref.stdout)}")
    print("ok: the Volcano pods (Gloo) trained with mpirun's losses:", loss(pods_out))
sys.exit(1 if failures else 0)
