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
together (the CPU path's host communicator is then Gloo) and must print mpirun's losses. The
elastic job (volcano-job-elastic.yaml: torchrun agents, PET_* options) is checked, and with
TRAIN_GPT and torchrun its pods train and lose one pod mid-run (exit 77 when torchrun is absent).
Usage: k8s_test.py BOOTSTRAP_CHECK SOURCE_DIR [TRAIN_GPT MPIEXEC]"""
import re
import uuid
import os, shutil, signal, socket, subprocess, sys, tempfile, time
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
    # Without the pytorch plugin (the elastic job: torchrun assigns ranks) no RANK/WORLD_SIZE/MASTER_*.
    pytorch = spec["plugins"].get("pytorch")
    args = dict(a.lstrip("-").split("=", 1) for a in pytorch or [])
    master, worker = args.get("master", "master"), args.get("worker", "worker")
    world = sum(t["replicas"] for t in spec["tasks"] if t["name"] in (master, worker))
    hosts = {t["name"]: [f"{jname}-{t['name']}-{i}.{jname}" for i in range(t["replicas"])] for t in spec["tasks"]}
    pods = []
    for t in spec["tasks"]:
        for i in range(t["replicas"]):
            env = {e["name"]: downward(e, jname, uid) for e in containers(t)[0].get("env", [])}
            if pytorch is not None:
                env.update({"MASTER_ADDR": f"{jname}-{master}-0.{jname}", "MASTER_PORT": str(port),
                            "WORLD_SIZE": str(world), "RANK": str(0 if t["name"] == master else i + 1)})
            env.update({"VC_TASK_INDEX": str(i), "VK_TASK_INDEX": str(i)})
            for tn, hs in hosts.items():
                env[f"VC_{tn.upper()}_HOSTS"] = ",".join(hs)
                env[f"VC_{tn.upper()}_NUM"] = str(len(hs))
            pods.append((f"{jname}-{t['name']}-{i}", env))
    return pods, [h for hs in hosts.values() for h in hs]

def hosts_file(tmp, fqdns):
    """/etc/hosts of the pods: the headless service's names, all on loopback."""
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for h in fqdns:
            f.write(f"127.0.0.1 {h} {h.split('.')[0]}\n")
    return hosts

def start_pod(pod, env, hosts, argv, stdout=subprocess.PIPE, cwd=None):
    """argv as pod `pod`: its own UTS and mount namespaces (host name, /etc/hosts) and its own
    process group (the whole pod can be killed at once)."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", **env}
    cmd = ["unshare", "--mount", "--uts", "sh", "-c",
           f'mount --bind "{hosts}" /etc/hosts && hostname "{pod}" && exec "$0" "$@"'] + argv
    return subprocess.Popen(cmd, env=full, stdout=stdout, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            cwd=cwd)

def simulate(job, cmd=None):
    """Runs cmd (default: bootstrap_check) in every pod; returns rank 0's output."""
    jname = job["metadata"]["name"]
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    # The manifest's port (23456) is the pods' own; locally another test may hold it.
    pods, fqdns = pod_envs(job, port)
    tmp = tempfile.mkdtemp(prefix="triax-k8s-")
    try:
        hosts = hosts_file(tmp, fqdns)
        procs = [(pod, env, start_pod(pod, env, hosts, cmd or [check])) for pod, env in pods]
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

def flag(args, name):
    return args[args.index(name) + 1] if name in args else None

def check_elastic(path):
    """volcano-job-elastic.yaml: torchrun agents with --nnodes MIN:MAX given as PET_* variables, gang
    of MIN, MAX replicas, the checkpoint volume (ReadWriteMany) under --save = --load, and no
    job-level RestartJob (it would kill the healthy pods that torchrun keeps training)."""
    docs = list(yaml.safe_load_all(open(path)))
    job = next(d for d in docs if d["kind"] == "Job")
    name, spec = os.path.basename(path), job["spec"]
    expect(job["apiVersion"] == "batch.volcano.sh/v1alpha1" and spec.get("schedulerName") == "volcano",
           f"{name}: a Volcano batch Job")
    plugins = spec.get("plugins", {})
    expect("svc" in plugins and "env" in plugins and "pytorch" not in plugins,
           f"{name}: svc and env plugins, not pytorch (torchrun assigns ranks)")
    (task,) = spec["tasks"]
    c = containers(task)[0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    lo, _, hi = (env.get("PET_NNODES") or "").partition(":")
    expect(lo.isdigit() and hi.isdigit() and int(lo) < int(hi), f"{name}: PET_NNODES is MIN:MAX ({env.get('PET_NNODES')})")
    expect(spec.get("minAvailable") == int(lo or 0), f"{name}: gang minAvailable {spec.get('minAvailable')} == MIN {lo}")
    expect(task["replicas"] == int(hi or 0), f"{name}: replicas {task['replicas']} == MAX {hi}")
    expect(c["command"][0] == "torchrun" and "train_gpt" in c["command"], f"{name}: torchrun runs train_gpt")
    for k in ("PET_NPROC_PER_NODE", "PET_MAX_RESTARTS", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID",
              "PET_MONITOR_INTERVAL", "PET_REDIRECTS", "PET_TEE"):
        expect(k in env, f"{name}: {k} set")
    jname = job["metadata"]["name"]
    expect((env.get("PET_RDZV_ENDPOINT") or "").startswith(f"{jname}-{task['name']}-0.{jname}:"),
           f"{name}: the rendezvous is pod 0's ({env.get('PET_RDZV_ENDPOINT')})")
    expect(env.get("PET_REDIRECTS") not in (None, "0") and env.get("PET_TEE") not in (None, "0"),
           f"{name}: --redirects and --tee non-zero (torch 1.13 on Python 3.11)")
    expect(limits(c).get("nvidia.com/gpu") == int(env.get("PET_NPROC_PER_NODE") or 0),
           f"{name}: one worker per GPU")
    args = c["args"]
    save = flag(args, "--save")
    expect(save is not None and save == flag(args, "--load"), f"{name}: --save == --load ({save})")
    expect(flag(args, "--save-interval-minutes") is not None, f"{name}: --save-interval-minutes")
    expect("," in (flag(args, "--tp") or ""), f"{name}: --tp is a list of preferred sizes ({flag(args, '--tp')})")
    vols = {v["name"]: v for v in task["template"]["spec"].get("volumes", [])}
    mount = [m for m in c.get("volumeMounts", []) if save and (save + "/").startswith(m["mountPath"].rstrip("/") + "/")]
    claim = vols.get(mount[0]["name"], {}).get("persistentVolumeClaim", {}).get("claimName") if mount else None
    pvc = [d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim]
    expect(len(mount) == 1 and claim is not None, f"{name}: a PVC is mounted where --save points ({claim})")
    expect(len(pvc) == 1 and "ReadWriteMany" in pvc[0]["spec"]["accessModes"], f"{name}: the PVC is ReadWriteMany")
    policies = spec.get("policies", []) + task.get("policies", [])
    expect(not any(p.get("action") == "RestartJob" for p in policies), f"{name}: no RestartJob (on PodEvicted/PodFailed)")
    expect(task["template"]["spec"].get("restartPolicy") == "OnFailure", f"{name}: restartPolicy OnFailure")
    return job

def elastic_pod_argv(c, train, tmp):
    """The container's torchrun command for a CPU box: a small model whose --tp list changes the
    layout with the world (4 pods: tp 2 x dp 2; 3 pods: tp 1 x dp 3; one rank per pod, so tp may
    span pods), short and frequent saves, no metrics port, each volume's mount path under tmp."""
    over = {"--model": "tiny", "--tp": "2,1", "--pp": "1", "--global-batch-size": "6", "--micro-batch-size": "1",
            "--train-iters": "20", "--save-interval": "4", "--metrics-port": None, "--num-layers": "2",
            "--hidden-size": "64", "--num-attention-heads": "4", "--seq-length": "32"}
    mounts = {m["mountPath"]: os.path.join(tmp, m["name"]) for m in c.get("volumeMounts", [])}
    a = c["args"]
    pairs = dict(zip(a[::2], a[1::2]))
    expect(all(k.startswith("--") for k in pairs) and len(a) % 2 == 0, "elastic: the container's args are flag value pairs")
    pairs.update(over)
    args = ["--allow-tp-across-hosts"]
    for k, v in pairs.items():
        if v is None:
            continue
        for mp, local in mounts.items():
            if v == mp or v.startswith(mp.rstrip("/") + "/"):
                v = local + v[len(mp.rstrip("/")):]
                os.makedirs(os.path.dirname(v), exist_ok=True)
        args += [k, v]
    return [train if x == "train_gpt" else x for x in c["command"]] + args

def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0

def wait_for(cond, timeout_s):
    end = time.time() + timeout_s
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False

def simulate_elastic(job, train):
    """Every pod of the elastic job as a local torchrun agent with the manifest's PET_* environment
    (overridden only where a CPU box needs it: one worker per pod, a free rendezvous port, a short
    last call); pod 0 (the c10d store's host) first. Once training is under way, the last pod is
    removed (its process group killed, as a lost node); the others must re-form at the smaller world
    from the last checkpoint and finish."""
    jname, c = job["metadata"]["name"], containers(job["spec"]["tasks"][0])[0]
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    pods, fqdns = pod_envs(job, port)
    tmp = tempfile.mkdtemp(prefix="triax-k8s-elastic-")
    procs = []
    try:
        hosts, argv = hosts_file(tmp, fqdns), elastic_pod_argv(c, train, tmp)
        for i, (pod, env) in enumerate(pods):
            host = env["PET_RDZV_ENDPOINT"].rsplit(":", 1)[0]
            # slow:150 on rank 0 from iteration 1: the tiny run lasts long enough to lose a pod in it.
            env.update(PET_NPROC_PER_NODE="1", PET_RDZV_ENDPOINT=f"{host}:{port}", PET_RDZV_CONF="last_call_timeout=1",
                       TRIAX_FAULT="0:1:slow:150", OPENBLAS_NUM_THREADS="1")
            log = open(os.path.join(tmp, f"{pod}.log"), "w")
            # Its own working directory: the flight recorder files of the ranks that saw the loss.
            wd = os.path.join(tmp, "wd", pod); os.makedirs(wd)
            procs.append((pod, env, start_pod(pod, env, hosts, argv, stdout=log, cwd=wd), log.name))
            if i == 0:  # the store's host binds the endpoint before the others look for it
                expect(wait_for(lambda: listening(port), 30), f"{jname}: pod 0 hosts the rendezvous on port {port}")
        out = lambda i: open(procs[i][3]).read()
        def at_full_world(o):  # iteration 6 or later done by an attempt at world len(pods)
            starts = [m.end() for m in re.finditer(rf"\(world {len(pods)}\); (?:resumed|no checkpoint)", o)]
            return bool(starts) and any(int(m.group(1)) >= 6 for m in re.finditer(r"iteration\s+(\d+)/", o[starts[-1]:]))
        started = wait_for(lambda: any(at_full_world(out(i)) for i in range(len(procs))), 90)
        expect(started, f"{jname}: {len(procs)} pods trained to iteration 6 together")
        victim = procs[-1]
        os.killpg(victim[2].pid, signal.SIGKILL)
        victim[2].wait(timeout=30)
        print(f"removed pod {victim[0]} (process group {victim[2].pid} killed)")
        deadline = time.time() + 150
        for pod, env, p, _ in procs[:-1]:
            try:
                rc = p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            expect(rc == 0, f"{jname}: pod {pod} finished after the loss (rc {rc})")
        outs = [out(i) for i in range(len(procs) - 1)]
        run_id = pods[0][1]["PET_RDZV_ID"]
        # Attempt 1 is at world 4, or 3 when a pod came after the first rendezvous's last call
        # (then it joined in attempt 2, a restart that torchrun does not count).
        first = [m.group(0) for o in outs + [out(len(procs) - 1)]
                 for m in re.finditer(r"elastic: attempt 1 of run '" + re.escape(run_id) + r"' [^\n\"]*", o)]
        expect(len(first) == 1, f"{jname}: rank 0 started attempt 1 of run '{run_id}': {first}")
        line = re.compile(r"elastic: attempt \d+ of run '" + re.escape(run_id) + r"' \(restart \d+ of \d+\): [^(]*\(world "
                          f"{len(pods)}" r"\) -> ([^(]*)\(world " f"{len(pods) - 1}" r"\); resumed from iteration (\d+)")
        hits = [m for o in outs for m in line.finditer(o)]
        expect(len(hits) >= 1, f"{jname}: rank 0 said the world went {len(pods)} -> {len(pods) - 1} and resumed")
        for m in hits:
            print("ok: the elastic line:", m.group(0))
        expect(any("elastic: training resumed" in o for o in outs), f"{jname}: rank 0 reported the recovery time")
        if failures:
            for (pod, _, _, _), o in zip(procs, outs):
                print(f"--- {pod} (last lines)\n" + "\n".join(o.splitlines()[-15:]))
    finally:
        for _, _, p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

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
    # The four pods of volcano-job.yaml train a small model as tp 2 x dp 2, the same as mpirun -np 4
    # (one rank per pod here, so tp spans two pods' host names: allowed explicitly).
    args = ["--tp", "2", "--dp", "2", "--train-iters", "3", "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "4", "--seq-length", "32", "--allow-tp-across-hosts"]
    pods_out = simulate(full, [train] + args) or ""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ref = subprocess.run([mpiexec, "--oversubscribe", "-np", "4", train] + args, env=env, capture_output=True,
                         text=True, timeout=300)
    expect(ref.returncode == 0, "mpirun -np 4 train_gpt" + ("" if ref.returncode == 0 else f": {ref.stdout}{ref.stderr}"))
    loss = lambda out: [l[l.index("lm loss:"):].split("|")[0].strip() for l in out.splitlines() if "lm loss:" in l]
    expect(len(loss(pods_out)) == 3, f"the Volcano pods printed 3 losses: {loss(pods_out)}")
    expect(loss(pods_out) == loss(ref.stdout), f"pods' losses {loss(pods_out)} == mpirun's {loss(ref.stdout)}")
    print("ok: the Volcano pods (Gloo) trained with mpirun's losses:", loss(pods_out))
elastic = check_elastic(os.path.join(k8s, "volcano-job-elastic.yaml"))
skip = None
if not train:
    skip = "SKIP: the elastic pods were not simulated (train_gpt with Gloo not built)"
elif shutil.which("torchrun") is None:
    skip = "SKIP: the elastic pods were not simulated (torchrun absent: Debian package python3-torch)"
else:
    simulate_elastic(elastic, train)
if skip:
    print(skip)
sys.exit(1 if failures else 77 if skip else 0)
