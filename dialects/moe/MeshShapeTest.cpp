//===- MeshShapeTest.cpp - parsing and rank coordinates of the mesh ------===//

#include "dialects/moe/MeshShape.h"

#include "gtest/gtest.h"

namespace moec::moe {
namespace {

TEST(MeshShape, ParsesAxesInAnyOrder) {
  MeshShape mesh;
  std::string error;
  ASSERT_TRUE(MeshShape::parse("ep=4,dp=2", mesh, error)) << error;
  EXPECT_EQ(mesh.dp, 2);
  EXPECT_EQ(mesh.tp, 1);
  EXPECT_EQ(mesh.pp, 1);
  EXPECT_EQ(mesh.ep, 4);
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.str(), "dp=2,ep=4");
  ASSERT_TRUE(MeshShape::parse("", mesh, error));
  EXPECT_TRUE(mesh.single());
  EXPECT_EQ(mesh.str(), "dp=1");
}

TEST(MeshShape, RejectsBadText) {
  MeshShape mesh;
  std::string error;
  EXPECT_FALSE(MeshShape::parse("dp=2,dp=2", mesh, error));
  EXPECT_EQ(error, "axis dp is given twice");
  EXPECT_FALSE(MeshShape::parse("xp=2", mesh, error));
  EXPECT_NE(error.find("dp, tp, pp, ep"), std::string::npos) << error;
  EXPECT_FALSE(MeshShape::parse("tp=0", mesh, error));
  EXPECT_NE(error.find("not '0'"), std::string::npos) << error;
  EXPECT_FALSE(MeshShape::parse("tp=2x", mesh, error));
}

TEST(MeshShape, TpRunsFastestThenEpDpPp) {
  MeshShape mesh{/*dp=*/2, /*tp=*/2, /*pp=*/2, /*ep=*/2};
  // rank 13 = 1 + 2*(0 + 2*(1 + 2*1)): tp 1, ep 0, dp 1, pp 1.
  EXPECT_EQ(mesh.coordinate(13, "tp"), 1);
  EXPECT_EQ(mesh.coordinate(13, "ep"), 0);
  EXPECT_EQ(mesh.coordinate(13, "dp"), 1);
  EXPECT_EQ(mesh.coordinate(13, "pp"), 1);
  EXPECT_EQ(mesh.coordinate(2, "ep"), 1);
  EXPECT_EQ(mesh.coordinate(2, "tp"), 0);
}

TEST(MeshShape, ARankOrderPutsItsAxesFirst) {
  MeshShape mesh;
  std::string error;
  ASSERT_TRUE(MeshShape::parse("dp=2,tp=2,pp=2,ep=2;order=ep,dp,tp,pp", mesh, error)) << error;
  // rank 13 = 1 + 2*(0 + 2*(1 + 2*1)): ep 1, dp 0, tp 1, pp 1.
  EXPECT_EQ(mesh.coordinate(13, "ep"), 1);
  EXPECT_EQ(mesh.coordinate(13, "dp"), 0);
  EXPECT_EQ(mesh.coordinate(13, "tp"), 1);
  EXPECT_EQ(mesh.coordinate(13, "pp"), 1);
  EXPECT_EQ(mesh.stride("ep"), 1);
  EXPECT_EQ(mesh.stride("tp"), 4);
  EXPECT_EQ(mesh.stride("pp"), 8);
  EXPECT_EQ(mesh.str(), "dp=2,tp=2,pp=2,ep=2");
  EXPECT_EQ(mesh.spec(), "dp=2,tp=2,pp=2,ep=2;order=ep,dp,tp,pp");
  MeshShape again;
  ASSERT_TRUE(MeshShape::parse(mesh.spec(), again, error)) << error;
  EXPECT_EQ(again.order, "ep,dp,tp,pp");
  // The default order is not written.
  ASSERT_TRUE(MeshShape::parse("ep=2;order=tp,ep,dp,pp", mesh, error)) << error;
  EXPECT_EQ(mesh.spec(), "ep=2");
}

TEST(MeshShape, ARankOrderListsAxesOnce) {
  std::string order, error;
  ASSERT_TRUE(MeshShape::parseOrder("ep,dp", order, error)) << error;
  EXPECT_EQ(order, "ep,dp,tp,pp"); // the rest in the default order
  ASSERT_TRUE(MeshShape::parseOrder("pp", order, error)) << error;
  EXPECT_EQ(order, "pp,tp,ep,dp");
  EXPECT_FALSE(MeshShape::parseOrder("tp,tp", order, error));
  EXPECT_EQ(error, "axis tp is listed twice");
  EXPECT_FALSE(MeshShape::parseOrder("tp,xp", order, error));
  EXPECT_EQ(error, "'xp' is not an axis (dp, tp, pp, ep); a rank order lists axes, the fastest first");
  EXPECT_FALSE(MeshShape::parseOrder("tp,", order, error));
  EXPECT_EQ(error, "'' is not an axis (dp, tp, pp, ep); a rank order lists axes, the fastest first");
  EXPECT_FALSE(MeshShape::parseOrder("", order, error));
  EXPECT_EQ(error, "no axes; a rank order lists axes, the fastest first");
  MeshShape mesh;
  EXPECT_FALSE(MeshShape::parse("tp=2;order=", mesh, error));
  EXPECT_FALSE(MeshShape::parse("tp=2;rank=tp", mesh, error));
  EXPECT_EQ(error, "'rank=tp' after ';' is not order=AXES");
}

} // namespace
} // namespace moec::moe
