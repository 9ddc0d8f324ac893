"""A client built only from code generated from the seed's streaming.proto and plain grpc.

Run as a script by test_seed_compat.py, in its own process, so that nothing of streamwal
is imported (the generated seed code would also collide with streamwal.proto's in the
protobuf descriptor pool): `python seed_client.py GEN_DIR ADDRESS PCHANNEL COUNT`.
Prints one JSON object with what it observed; every protocol step is asserted here.
"""

from __future__ import annotations

import json
import queue
import sys

import grpc

GEN_DIR, ADDRESS, PCHANNEL, COUNT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, GEN_DIR)

import milvus_pb2  # noqa: E402
import streaming_pb2 as spb  # noqa: E402
import streaming_pb2_grpc as sgrpc  # noqa: E402

TIMEOUT = 20


def requests(q: queue.Queue):
    while True:
        item = q.get(timeout=TIMEOUT)
        if item is None:
            return
        yield item


def main() -> dict:
    out: dict = {}
    with grpc.insecure_channel(ADDRESS) as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
        manager = sgrpc.StreamingNodeManagerServiceStub(channel)
        handler = sgrpc.StreamingNodeHandlerServiceStub(channel)
        state = sgrpc.StreamingNodeStateServiceStub(channel)
        pch = spb.PChannelInfo(name=PCHANNEL, term=1)

        manager.Assign(spb.StreamingNodeManagerAssignRequest(pchannel=pch), timeout=TIMEOUT)
        manager.Assign(spb.StreamingNodeManagerAssignRequest(pchannel=pch), timeout=TIMEOUT)

        # -- produce: one ProduceMessageRequest per message, several in flight ---------------
        q: queue.Queue = queue.Queue()
        header = spb.CreateProducerRequest(pchannel=pch).SerializeToString()
        responses = handler.Produce(
            requests(q), metadata=(("create-producer-bin", header),), timeout=TIMEOUT
        )
        first = next(responses)
        assert first.WhichOneof("response") == "create", first
        out["producer_id"] = first.create.producer_id
        for i in range(COUNT):
            msg = spb.Message(
                payload=f"seed-{i}".encode(),
                properties={"_vc": f"{PCHANNEL}_v{i % 2}", "user": str(i)},
            )
            q.put(spb.ProduceRequest(produce=spb.ProduceMessageRequest(request_id=i, message=msg)))
        ids: dict[int, int] = {}
        for _ in range(COUNT):
            resp = next(responses)
            assert resp.WhichOneof("response") == "produce", resp
            assert resp.produce.WhichOneof("response") == "result", resp
            ids[resp.produce.request_id] = int.from_bytes(resp.produce.result.id.id, "big")
        q.put(spb.ProduceRequest(close=spb.CloseProducerRequest()))
        closing = next(responses)
        assert closing.WhichOneof("response") == "close", closing
        assert next(responses, None) is None, "the stream goes on after the close response"
        q.put(None)
        out["offsets"] = [ids[i] for i in range(COUNT)]

        # -- consume: no streamwal options, so one ConsumeMessageReponse per message ----------
        q = queue.Queue()
        header = spb.CreateConsumerRequest(
            pchannel=pch, deliver_policy=spb.DeliverPolicy(all={})
        ).SerializeToString()
        responses = handler.Consume(
            requests(q), metadata=(("create-consumer-bin", header),), timeout=TIMEOUT
        )
        first = next(responses)
        assert first.WhichOneof("response") == "create", first
        got = []
        while len(got) < COUNT:
            resp = next(responses)
            assert resp.WhichOneof("response") == "consume", resp
            props = dict(resp.consume.message.properties)
            assert "_tt" in props and props["_wt"] == "1", props
            if props.get("_t") == "1200":
                continue
            got.append(
                {
                    "offset": int.from_bytes(resp.consume.id.id, "big"),
                    "payload": resp.consume.message.payload.decode(),
                    "properties": props,
                }
            )
        q.put(spb.ConsumeRequest(close=spb.CloseConsumerRequest()))
        for resp in responses:  # frames already on the way come before the close response
            if resp.WhichOneof("response") == "close":
                out["consumer_closed"] = True
                break
            assert resp.WhichOneof("response") == "consume", resp
        q.put(None)
        out["consumed"] = got

        states = state.GetComponentStates(milvus_pb2.GetComponentStatesRequest(), timeout=TIMEOUT)
        out["state"] = {
            "node_id": states.state.nodeID,
            "role": states.state.role,
            "state_code": milvus_pb2.StateCode.Name(states.state.state_code),
        }
    out["streamwal_imported"] = sorted(m for m in sys.modules if m.startswith("streamwal"))
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
