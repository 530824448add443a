//! The in-process backend's collectives: results, determinism across ranks, and errors.

use std::time::{Duration, Instant};

use kiln_dist::{BufMut, Collective, DistError, ErrorKind, Op, ReduceOp, ThreadCollective, ThreadGroup};

/// Runs `f` on every handle of `handles`, each on its own thread; returns the results by rank.
fn on_threads<R: Send>(handles: Vec<ThreadCollective>, f: impl Fn(ThreadCollective) -> R + Sync) -> Vec<R> {
    ThreadGroup::run(handles, f).into_iter().map(|r| r.expect("a rank panicked")).collect()
}

#[test]
fn reductions_are_in_rank_order_and_the_same_bits_everywhere() {
    // Values where the order of the additions changes the float result.
    let values = [1e8f32, 1.0, -1e8, 1.0];
    let results = on_threads(ThreadGroup::new(4), move |mut comm| {
        let r = comm.rank();
        let mut out = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            let mut x = vec![values[r], r as f32];
            comm.all_reduce(x.as_mut_slice().into(), op).unwrap();
            out.push(x);
        }
        let mut d = vec![r as f64 * 0.5];
        comm.all_reduce(d.as_mut_slice().into(), ReduceOp::Sum).unwrap();
        let mut i = vec![r as i32, -(r as i32)];
        comm.all_reduce(i.as_mut_slice().into(), ReduceOp::Max).unwrap();
        (out, d, i)
    });
    let folded = ((1e8f32 + 1.0) + -1e8) + 1.0;
    for (out, d, i) in &results {
        assert_eq!(out[0], vec![folded, 6.0]);
        assert_eq!(out[1], vec![folded / 4.0, 1.5]);
        assert_eq!(out[2], vec![1e8, 3.0]);
        assert_eq!(out[3], vec![-1e8, 0.0]);
        assert_eq!(d, &vec![3.0]);
        assert_eq!(i, &vec![3, 0]);
    }
}

#[test]
fn broadcast_all_gather_and_barrier() {
    let results = on_threads(ThreadGroup::new(3), |mut comm| {
        let r = comm.rank();
        let mut b = vec![r as f32 + 10.0; 2];
        comm.broadcast(b.as_mut_slice().into(), 2).unwrap();
        let gathered = comm.all_gather_f32(&[r as f32, -(r as f32)]).unwrap();
        comm.barrier().unwrap();
        (b, gathered)
    });
    for (b, gathered) in results {
        assert_eq!(b, vec![12.0, 12.0]);
        assert_eq!(gathered, vec![0.0, -0.0, 1.0, -1.0, 2.0, -2.0]);
    }
}

#[test]
fn ranks_that_disagree_all_get_the_same_mismatch_error() {
    let results = on_threads(ThreadGroup::new(2), |mut comm| {
        let mut x = vec![0f32; 2 + comm.rank()];
        let e = comm.all_reduce(x.as_mut_slice().into(), ReduceOp::Sum).unwrap_err();
        // The ranks are still in step: the next collective works.
        comm.barrier().unwrap();
        e
    });
    for (rank, e) in results.iter().enumerate() {
        assert_eq!(e.rank, rank);
        assert_eq!(e.kind, ErrorKind::Mismatch("rank 0 gave 2 f32 but rank 1 gave 3 f32".into()), "{e}");
    }
    let results = on_threads(ThreadGroup::new(2), |mut comm| {
        if comm.rank() == 0 { comm.barrier() } else { comm.all_gather_f32(&[1.0]).map(|_| ()) }
    });
    let e = results[1].as_ref().unwrap_err();
    assert_eq!(
        e.to_string(),
        "all_gather on rank 1 of 2: ranks disagree: rank 0 called barrier but rank 1 called all_gather"
    );
}

#[test]
fn invalid_calls_fail_on_the_caller_before_any_communication() {
    let mut comm = ThreadGroup::new(2).remove(0);
    let mut x = [0f32; 2];
    let e = comm.broadcast(BufMut::F32(&mut x), 2).unwrap_err();
    assert_eq!(e.op, Op::Broadcast { root: 2 });
    assert_eq!(
        e.to_string(),
        "broadcast(root 2) on rank 0 of 2: invalid argument: root 2 is not a rank of a group of 2"
    );
    let mut i = [1i32];
    assert!(matches!(comm.all_reduce(BufMut::I32(&mut i), ReduceOp::Mean).unwrap_err().kind, ErrorKind::Invalid(_)));
    let mut recv = [0f32; 3];
    let e = comm.all_gather(BufMut::F32(&mut x), BufMut::F32(&mut recv)).unwrap_err();
    assert!(e.to_string().contains("holds 3 elements, not 4"), "{e}");
}

#[test]
fn a_dropped_rank_fails_the_others_at_once() {
    let mut handles = ThreadGroup::new(3);
    drop(handles.pop());
    let started = Instant::now();
    let results = on_threads(handles, |mut comm| comm.barrier());
    for (rank, r) in results.iter().enumerate() {
        let e: &DistError = r.as_ref().unwrap_err();
        assert!(
            e.kind == ErrorKind::PeerGone { peer: 2 } || matches!(e.kind, ErrorKind::GroupFailed(_)),
            "rank {rank}: {e}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_missing_rank_times_out_and_later_calls_fail_fast() {
    let mut handles = ThreadGroup::with_timeout(2, Duration::from_millis(200));
    let _silent = handles.pop();
    let mut comm = handles.pop().unwrap();
    let started = Instant::now();
    let e = comm.barrier().unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(200) && started.elapsed() < Duration::from_secs(10));
    assert!(matches!(&e.kind, ErrorKind::Timeout { missing, .. } if missing == &[1]), "{e}");
    assert!(e.to_string().starts_with("barrier on rank 0 of 2: timed out after"), "{e}");
    let started = Instant::now();
    let e = comm.barrier().unwrap_err();
    assert!(matches!(e.kind, ErrorKind::GroupFailed(_)), "{e}");
    assert!(started.elapsed() < Duration::from_millis(100), "no second wait");
}
