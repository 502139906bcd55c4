"""Why did the final contest time grouped 4x128^3 finalists at 0.08 ms when the search timed 0.006?"""
import time, warnings, torch, kernels
from kernels import Config, Problem
from tuner import suites
from tuner.bench import Bench
from tuner.workers import CheckPool, IsolatedBench


def main():
    key = "fp16:nn:" + suites.GROUPS_GPU["4x128^3"]
    problem = Problem.from_key("grouped_matmul", key)
    texts = ["BLOCK_M: 16, BLOCK_N: 32, BLOCK_K: 128, NUM_SM: 128, num_warps: 4, num_stages: 5",
             "BLOCK_M: 16, BLOCK_N: 32, BLOCK_K: 128, NUM_SM: 128, num_warps: 2, num_stages: 4",
             "BLOCK_M: 32, BLOCK_N: 32, BLOCK_K: 32, NUM_SM: 64, num_warps: 2, num_stages: 3"]
    configs = [Config.parse(t) for t in texts]
    device = kernels.current_device()
    spec = kernels.get_kernel("grouped_matmul")
    bench = Bench(spec, problem, device)
    print("in-process measure", [round(bench.measure(c).time_ms, 4) for c in configs])
    print("in-process contest", bench.contest(configs))
    print("in-process contest one", bench.contest(configs[:1]))
    inputs = bench._fresh_inputs()
    spec.execute(configs[0], inputs); torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            spec.execute(configs[0], inputs)
        spec.baseline(inputs)
        for _ in range(3):
            spec.execute(configs[0], inputs)
    torch.cuda.set_sync_debug_mode(0)
    print("sync warnings:", [str(x.message)[:120] for x in w])
    t = time.perf_counter(); n = 200
    for _ in range(n): spec.execute(configs[0], inputs)
    torch.cuda.synchronize(); print(f"host+gpu per call {1e6*(time.perf_counter()-t)/n:.1f} us")
    with CheckPool() as pool:
        pool.start()
        iso = IsolatedBench(pool.timing, "grouped_matmul", problem, device, seed=1)
        print("isolated measure", [round(iso.measure(c).time_ms, 4) for c in configs])
        print("isolated contest", iso.contest(configs))
        print("isolated baseline", iso.baseline_ms())
        print("isolated contest again", iso.contest(configs))


if __name__ == '__main__':
    main()
